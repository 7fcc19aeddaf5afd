//go:build !linux

package rollout

// bigSlice returns n zeroed elements for a large buffer that lives as long
// as the engine, and the function that frees it (nothing to do here).
func bigSlice[T any](n int) ([]T, func()) { return make([]T, n), func() {} }
