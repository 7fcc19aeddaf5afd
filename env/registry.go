package env

import (
	"fmt"
	"sort"
	"strings"
)

// builtins makes the built-in environments by name; each Lookup gets a
// new one.
var builtins = map[string]func() Environment{
	"tools": func() Environment { return NewTools(Calculator()) },
	"guess": Guess,
}

// Lookup returns a built-in environment by name (see Names): "tools" is
// NewTools(Calculator()), "guess" is Guess(). An environment over HTTP is
// made with NewHTTP instead.
func Lookup(name string) (Environment, error) {
	if f, ok := builtins[name]; ok {
		return f(), nil
	}
	return nil, fmt.Errorf("unknown environment %q (built-in: %s)", name, strings.Join(Names(), ", "))
}

// Names lists the built-in environments, sorted.
func Names() []string {
	n := make([]string, 0, len(builtins))
	for k := range builtins {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}
