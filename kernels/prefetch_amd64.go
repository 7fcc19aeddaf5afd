//go:build amd64 && !purego

package kernels

import "unsafe"

//go:noescape
func prefetchLines(p unsafe.Pointer, lines int)

func prefetch(p unsafe.Pointer, bytes int) { prefetchLines(p, (bytes+63)/64) }
