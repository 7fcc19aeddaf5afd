package run

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// LockFile is the name of the lock file Lock keeps in a run directory.
const LockFile = "LOCK"

// ErrLocked is matched (with errors.Is) by the error Lock returns when
// another process holds the run directory.
var ErrLocked = errors.New("run directory is locked")

// LockedError is the error Lock returns when the run directory is held.
// PID and Command are what the holder wrote into the lock file; PID is 0
// when it could not be read (the holder had taken the lock but not yet
// written it, or the file was edited).
type LockedError struct {
	Dir     string
	PID     int
	Command string
}

func (e *LockedError) Error() string {
	who := "another process"
	if e.PID > 0 {
		who = "process " + strconv.Itoa(e.PID)
		if e.Command != "" {
			who += " (" + e.Command + ")"
		}
	}
	return fmt.Sprintf("%s is in use by %s; stop it or choose another run directory", e.Dir, who)
}

// Is makes errors.Is(err, ErrLocked) true.
func (e *LockedError) Is(target error) bool { return target == ErrLocked }

// DirLock is a held run-directory lock.
type DirLock struct {
	f    *os.File
	path string
}

// Lock takes the lock on run directory dir (creating it if needed), so two
// processes never write one run's checkpoints and logs at once: their
// writes would interleave, and each would prune or replace the other's
// checkpoints. It does not wait: if another process holds dir, it returns
// a *LockedError naming that process.
//
// The lock is an advisory flock on dir/LOCK, not the file's existence, so
// it dies with its holder: after a crash or kill -9 the kernel releases it
// and the LOCK file left behind does not block the next run. The file
// only says who holds the lock (PID and command line), for the message.
// flock locks belong to an open file description, so a second Lock on the
// same directory conflicts even within one process, and the descriptor is
// close-on-exec, so a process started by the holder does not inherit the
// lock. On platforms without flock Lock succeeds without locking (see
// lock_other.go).
func Lock(dir string) (*DirLock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, LockFile)
	// Not O_TRUNC: until we hold the lock, the contents are the holder's.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	held, err := tryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: lock: %w", path, err)
	}
	if !held {
		b, _ := os.ReadFile(path)
		f.Close()
		pid, cmd := parseLockFile(b)
		return nil, &LockedError{Dir: dir, PID: pid, Command: cmd}
	}
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt(lockFileContents(), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &DirLock{f: f, path: path}, nil
}

// lockFileContents is what the holder writes into the lock file: its PID
// on the first line, its command line on the second.
func lockFileContents() []byte {
	cmd := strings.Join(os.Args, " ")
	cmd = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, cmd)
	if len(cmd) > 512 {
		cmd = cmd[:512] + "..."
	}
	return []byte(strconv.Itoa(os.Getpid()) + "\n" + cmd + "\n")
}

func parseLockFile(b []byte) (pid int, cmd string) {
	first, rest, _ := bytes.Cut(b, []byte("\n"))
	pid, err := strconv.Atoi(string(bytes.TrimSpace(first)))
	if err != nil || pid <= 0 {
		return 0, ""
	}
	cmd, _, _ = strings.Cut(string(rest), "\n")
	return pid, strings.TrimSpace(cmd)
}

// Unlock releases the lock and closes the lock file, which is left in
// place (removing it would race with a process that has just opened it
// and is about to lock it). Unlocking twice is a no-op.
func (l *DirLock) Unlock() error {
	if l.f == nil {
		return nil
	}
	err := unlock(l.f)
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	if err != nil {
		return fmt.Errorf("%s: unlock: %w", l.path, err)
	}
	return nil
}
