//go:build !amd64 || purego

package rollout

import "github.com/keel-rl/keel/kernels"

// Without amd64 assembly the bf16 attention runs the Go loops.
var useBF16Asm = false

func dotRowsBF16AVX512(s, q *float32, k *kernels.BF16, n, d, ld int, scale float32) {
	panic("rollout: no assembly on this platform")
}

func axpyRowsBF16AVX512(out, p *float32, v *kernels.BF16, n, d, ld int) {
	panic("rollout: no assembly on this platform")
}
