//go:build unix

package reward

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// child starts "sleep 30" on the helper's stdout (own: in a process group
// of its own) and writes its pid to $KEEL_REWARD_PIDFILE.
func child(own bool) {
	cmd := exec.Command("sleep", "30")
	cmd.Stdout = os.Stdout
	if own {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.WriteFile(os.Getenv("KEEL_REWARD_PIDFILE"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
}

// childPid reads the pid the helper wrote.
func childPid(t *testing.T, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	pid, err2 := strconv.Atoi(string(b))
	if err != nil || err2 != nil {
		t.Fatalf("pid file: %v %v", err, err2)
	}
	return pid
}

// gone reports whether pid has ended (a zombie awaiting its reaper
// counts as ended), waiting up to 5 s.
func gone(pid int) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); len(f) > 0 && f[0] == "Z" {
				return true
			}
		}
	}
	return false
}

// Close leaves no process behind: the grader's child ends too.
func TestCommandCloseKillsChildren(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	t.Setenv("KEEL_REWARD_PIDFILE", pidFile)
	c := newClient(t, Options{Command: helperCommand(t, "child")})
	checkGood(t, c.Score(context.Background(), items(2)))
	pid := childPid(t, pidFile)
	defer syscall.Kill(pid, syscall.SIGKILL)
	c.Close()
	if !gone(pid) {
		t.Fatalf("the grader's child %d outlived Close", pid)
	}
}

// A child outside the grader's process group holding stdout does not hang
// the kill: the wait for stdout's end is bounded.
func TestCommandEscapedChild(t *testing.T) {
	old := killWait
	killWait = 300 * time.Millisecond
	defer func() { killWait = old }()
	pidFile := filepath.Join(t.TempDir(), "pid")
	t.Setenv("KEEL_REWARD_PIDFILE", pidFile)
	c := newClient(t, Options{Command: helperCommand(t, "escape"), Timeout: 500 * time.Millisecond})
	start := time.Now()
	res := scoreWithin(t, 10*time.Second, c, items(1))
	defer syscall.Kill(childPid(t, pidFile), syscall.SIGKILL)
	if res[0].Err == nil || !strings.Contains(res[0].Err.Error(), "no answer") {
		t.Fatalf("got %v, want no answer", res[0].Err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %v", d)
	}
}
