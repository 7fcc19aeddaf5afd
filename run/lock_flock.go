//go:build linux || darwin

package run

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// lockSupported says Lock really excludes other processes here.
const lockSupported = true

// tryLock takes a non-blocking exclusive flock on f. It reports false,
// with no error, when another open file description holds it.
func tryLock(f *os.File) (bool, error) {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, unix.EWOULDBLOCK):
			return false, nil
		case errors.Is(err, unix.EINTR):
			continue
		}
		return false, err
	}
}

func unlock(f *os.File) error { return unix.Flock(int(f.Fd()), unix.LOCK_UN) }
