//go:build !amd64

package kernels

func toBF16Fast(dst []BF16, src []float32) int { return 0 }

// bf16Tile computes one 14×32 tile (see bf16TileGo).
func bf16Tile(kp int, a []BF16, lda int, b []uint32, c []float32, ldc, mr int, mask uint32, accumulate bool, sa, sb []float32) {
	bf16TileGo(kp, a, lda, b, c, ldc, mr, mask, accumulate, sa, sb)
}
