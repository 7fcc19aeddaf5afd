//go:build !linux || nocuda

package cuda

import (
	"fmt"
	"runtime"
)

// errNoCUDA says why this build cannot load CUDA: keel runs CUDA on Linux,
// and a build with -tags nocuda (a fully static binary) leaves it out.
var errNoCUDA = func() error {
	if runtime.GOOS != "linux" {
		return fmt.Errorf("%w: keel runs CUDA on Linux only", ErrNoCUDA)
	}
	return fmt.Errorf("%w: this keel was built with -tags nocuda", ErrNoCUDA)
}()

func dlopen(name string) (uintptr, error) { return 0, errNoCUDA }

func register(fn any, h uintptr, name string) error { return missingSymbol(name, errNoCUDA) }

func hasSymbol(h uintptr, name string) bool { return false }

// loadDisabled is why this build loads no CUDA library.
var loadDisabled = errNoCUDA
