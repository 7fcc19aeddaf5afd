package kernels

import "unsafe"

// Prefetch asks the processor to bring x into its caches ahead of use: a
// hint with no effect on results. It is for data that will be read soon in
// a pattern the hardware prefetchers cannot foresee, such as the rollout
// engine's next sequence's keys and values, read from memory at a new
// address every few microseconds. Does nothing where there is no prefetch
// instruction.
func Prefetch[T any](x []T) {
	if len(x) == 0 {
		return
	}
	var zero T
	prefetch(unsafe.Pointer(&x[0]), len(x)*int(unsafe.Sizeof(zero)))
}
