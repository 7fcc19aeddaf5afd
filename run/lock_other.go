//go:build !linux && !darwin

package run

import "os"

// lockSupported says Lock really excludes other processes here. Without
// flock (Windows, Plan 9, ...) there is no lock that the kernel releases
// when its holder dies, and a lock file that must be removed by hand after
// every crash would do more harm than good, so Lock only records the
// holder in the LOCK file and always succeeds: on these platforms keeping
// two runs out of one directory is up to the user.
const lockSupported = false

func tryLock(*os.File) (bool, error) { return true, nil }

func unlock(*os.File) error { return nil }
