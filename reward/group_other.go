//go:build !unix

package reward

import "os/exec"

// ownGroup does nothing here: only the process itself is killed (its
// children may outlive it; the bounded wait in kill copes with one that
// holds stdout).
func ownGroup(cmd *exec.Cmd) {}

// killGroup kills cmd's process.
func killGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		cmd.Process.Kill()
	}
}
