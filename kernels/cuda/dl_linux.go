//go:build linux && !nocuda

package cuda

import "github.com/ebitengine/purego"

// dlopen opens a shared library by path or soname, its symbols global (so
// that a library it loads later, such as NVRTC's builtins, resolves them).
func dlopen(name string) (uintptr, error) {
	return purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL)
}

// register binds fn (a pointer to a func variable) to the symbol name of
// the library h, as an error rather than purego's panic when the symbol is
// missing (an older library than keel expects).
func register(fn any, h uintptr, name string) error {
	sym, err := purego.Dlsym(h, name)
	if err != nil {
		return missingSymbol(name, err)
	}
	purego.RegisterFunc(fn, sym)
	return nil
}

// hasSymbol says whether the library h defines name.
func hasSymbol(h uintptr, name string) bool {
	_, err := purego.Dlsym(h, name)
	return err == nil
}

// loadDisabled is nil: this build loads CUDA's libraries.
var loadDisabled error
