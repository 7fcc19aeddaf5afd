//go:build !amd64 || purego

package kernels

import "unsafe"

func prefetch(p unsafe.Pointer, bytes int) {}
