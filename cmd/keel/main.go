// Command keel is reinforcement learning for language models that stays
// stable: see README.md. Each subcommand lives in its own file and registers
// itself in an init function.
package main

import (
	"fmt"
	"os"
	"sort"

	"github.com/keel-rl/keel/kernels/cuda"
)

// command is one keel subcommand. run receives the arguments after the
// subcommand's name and returns an error to print; it never calls os.Exit.
type command struct {
	name    string
	summary string
	run     func(args []string) error
}

var commands = map[string]command{}

func register(c command) { commands[c.name] = c }

func usage() {
	fmt.Fprintln(os.Stderr, "usage: keel COMMAND [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(os.Stderr, "\nRun 'keel COMMAND -h' for a command's flags.")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	// A kernel source's first use on a machine compiles it, which can take
	// a while: say so rather than look hung.
	cuda.CompileNotice = os.Stderr
	c, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "keel: unknown command %q\n\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if err := c.run(os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "keel %s: %v\n", c.name, err)
		os.Exit(1)
	}
}
