// Package sysmem says how much memory the machine has, so that a command
// about to allocate more than that fails with a clear error instead of
// being killed.
package sysmem

import (
	"os"
	"strconv"
	"strings"
)

// Total returns the machine's memory in bytes where the system says
// (Linux's /proc/meminfo), else false.
func Total() (uint64, bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	return parse(string(b))
}

func parse(meminfo string) (uint64, bool) {
	for _, line := range strings.Split(meminfo, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			return kb * 1024, err == nil
		}
	}
	return 0, false
}
