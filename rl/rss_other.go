//go:build !linux

package rl

// peakRSS is not measured off Linux.
func peakRSS() int64 { return 0 }
