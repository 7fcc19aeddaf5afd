package run

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func requireLocking(t *testing.T) {
	t.Helper()
	if !lockSupported {
		t.Skip("Lock does not exclude other processes on this platform")
	}
}

func TestLockSameProcess(t *testing.T) {
	requireLocking(t)
	dir := filepath.Join(t.TempDir(), "runs", "x")
	// A stale, longer record from an earlier holder must neither block nor
	// survive in part.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	stale := "999999\n" + strings.Repeat("old-command ", 200) + "\nleftover\n"
	if err := os.WriteFile(filepath.Join(dir, LockFile), []byte(stale), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := Lock(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, LockFile))
	if err != nil {
		t.Fatal(err)
	}
	if pid, cmd := parseLockFile(b); pid != os.Getpid() || cmd != strings.Join(os.Args, " ") {
		t.Fatalf("lock file %q does not hold our PID %d and command line", b, os.Getpid())
	}
	if strings.Contains(string(b), "old-command") || strings.Count(string(b), "\n") != 2 {
		t.Fatalf("lock file %q keeps stale contents", b)
	}

	// flock locks belong to an open file description: a second Lock opens
	// the file again and must conflict, even in the same process.
	_, err = Lock(dir)
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Lock: %v, want ErrLocked", err)
	}
	var le *LockedError
	if !errors.As(err, &le) || le.PID != os.Getpid() || le.Dir != dir {
		t.Fatalf("second Lock: %#v", err)
	}
	msg := err.Error()
	for _, want := range []string{dir, "process " + strconv.Itoa(os.Getpid()), os.Args[0], "choose another run directory"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not contain %q", msg, want)
		}
	}
	// The failed attempt must not have touched the holder's record.
	if b2, _ := os.ReadFile(filepath.Join(dir, LockFile)); string(b2) != string(b) {
		t.Errorf("lock file changed by a failed Lock: %q -> %q", b, b2)
	}

	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatalf("second Unlock: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, LockFile)); err != nil {
		t.Errorf("Unlock removed the lock file: %v", err)
	}
	l2, err := Lock(dir)
	if err != nil {
		t.Fatalf("Lock after Unlock: %v", err)
	}
	defer l2.Unlock()
}

func TestLockedErrorMessage(t *testing.T) {
	for _, tc := range []struct {
		file string
		want string
	}{
		{"1234\nkeel rl --run runs/x\n", "runs/x is in use by process 1234 (keel rl --run runs/x); stop it or choose another run directory"},
		{"1234\n", "runs/x is in use by process 1234; stop it or choose another run directory"},
		{"", "runs/x is in use by another process; stop it or choose another run directory"},
		{"garbage\n", "runs/x is in use by another process; stop it or choose another run directory"},
	} {
		pid, cmd := parseLockFile([]byte(tc.file))
		err := error(&LockedError{Dir: "runs/x", PID: pid, Command: cmd})
		if got := err.Error(); got != tc.want {
			t.Errorf("file %q: %q, want %q", tc.file, got, tc.want)
		}
		if !errors.Is(fmt.Errorf("wrapped: %w", err), ErrLocked) {
			t.Errorf("errors.Is(wrapped LockedError, ErrLocked) is false")
		}
	}
}

// TestLockHelper is not a test: it is the child process of
// TestLockOtherProcess. It takes the lock on $KEEL_LOCK_DIR, says so on
// stdout and holds the lock until stdin closes (or it is killed).
func TestLockHelper(t *testing.T) {
	if os.Getenv("GO_WANT_HELPER_PROCESS") != "1" {
		t.Skip("helper process for TestLockOtherProcess")
	}
	l, err := Lock(os.Getenv("KEEL_LOCK_DIR"))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("locked")
	bufio.NewReader(os.Stdin).ReadString('\n')
	l.Unlock()
	os.Exit(0)
}

func TestLockOtherProcess(t *testing.T) {
	requireLocking(t)
	dir := filepath.Join(t.TempDir(), "run")
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockHelper$")
	cmd.Env = append(os.Environ(), "GO_WANT_HELPER_PROCESS=1", "KEEL_LOCK_DIR="+dir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	killed := false
	defer func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if s != "locked\n" {
			t.Fatalf("helper said %q", s)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("helper did not take the lock within 30s")
	}
	child := cmd.Process.Pid

	_, err = Lock(dir)
	var le *LockedError
	if !errors.Is(err, ErrLocked) || !errors.As(err, &le) {
		t.Fatalf("Lock while the helper holds it: %v, want ErrLocked", err)
	}
	if le.PID != child || !strings.Contains(err.Error(), "process "+strconv.Itoa(child)) {
		t.Fatalf("error %q does not name the helper's PID %d", err, child)
	}
	if !strings.Contains(le.Command, "-test.run=^TestLockHelper$") {
		t.Errorf("holder command %q is not the helper's", le.Command)
	}

	// A crash: the helper dies without unlocking, leaving its record in
	// the lock file. The kernel has released the flock, so the directory
	// is free again.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed = true
	b, _ := os.ReadFile(filepath.Join(dir, LockFile))
	if pid, _ := parseLockFile(b); pid != child {
		t.Fatalf("after the crash the lock file holds %q, want the dead helper's PID %d", b, child)
	}
	l, err := Lock(dir)
	if err != nil {
		t.Fatalf("Lock after the holder was killed: %v", err)
	}
	defer l.Unlock()
	b, _ = os.ReadFile(filepath.Join(dir, LockFile))
	if pid, _ := parseLockFile(b); pid != os.Getpid() {
		t.Errorf("lock file %q does not hold our PID %d after taking over", b, os.Getpid())
	}
	if strings.Count(string(b), "\n") != 2 {
		t.Errorf("lock file %q is not exactly two lines (stale contents left?)", b)
	}
}
