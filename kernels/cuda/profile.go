package cuda

import (
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"text/tabwriter"
	"time"
)

// profile times every kernel launch and cuBLASLt product of a device when
// KEEL_CUDA_PROFILE=1: each is preceded and followed by a synchronisation,
// so its wall time is its own (plus a launch's few microseconds), and the
// table, printed to stderr when the device closes, shows where a step's
// device time goes. Synchronising serialises the host with the device, so
// a profiled run is slower than a plain one: read shares, not speeds.
//
// A row's first call is kept apart: it pays for what the host does once
// (a cuBLASLt plan's heuristic query, the driver's lazy loading of a
// kernel's image), which a row of few calls would otherwise spread over
// its mean. Only the first call of each row's name: a second plan under
// the same name (another leading dimension), a plan made again after the
// cache of plans dropped it, or an algorithm timed later (KEEL_BLAS_TUNE,
// postponed while a graph records) still lands in the mean. On an H200 (2026-11-27) the MoE shape's q product, 16 calls
// in the profile, came out at 6.7 ms a call for 69 GFLOP, where the same
// library ran the 0.6B shape's products at 530-620 TFLOP/s: the first
// call's time inside the mean, most likely.
type profile struct {
	mu    sync.Mutex
	start time.Time
	rows  map[string]*profileRow
}

type profileRow struct {
	calls int           // after the first
	total time.Duration // of the calls after the first
	first time.Duration
}

func newProfile() *profile {
	if os.Getenv("KEEL_CUDA_PROFILE") != "1" {
		return nil
	}
	return &profile{start: time.Now(), rows: map[string]*profileRow{}}
}

// time runs f (which issues work on the device) between two
// synchronisations and adds its wall time to name's row. Called with the
// context current.
func (p *profile) time(dev *Device, name string, f func() error) error {
	recording.RLock() // no synchronisation while a graph records
	defer recording.RUnlock()
	d := dev.drv
	if err := d.check(d.ctxSynchronize(), "cuCtxSynchronize"); err != nil {
		return err
	}
	t0 := time.Now()
	err := f()
	if e := d.check(d.ctxSynchronize(), "cuCtxSynchronize"); err == nil {
		err = e
	}
	p.add(name, time.Since(t0))
	return err
}

// add counts one call of name that took dt: the first apart.
func (p *profile) add(name string, dt time.Duration) {
	p.mu.Lock()
	r := p.rows[name]
	if r == nil {
		p.rows[name] = &profileRow{first: dt}
	} else {
		r.calls++
		r.total += dt
	}
	p.mu.Unlock()
}

// write prints the rows by their time after the first call, longest
// first, each with its first call's time, and what the device work adds
// up to against the wall time since the device opened.
func (p *profile) write(w io.Writer, device string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	names := make([]string, 0, len(p.rows))
	var sum, firsts time.Duration
	for n, r := range p.rows {
		names = append(names, n)
		sum += r.total
		firsts += r.first
	}
	// By the time after the first call, then by all of it (a row of one
	// large call is not lost under the table's cut), then by name.
	sort.Slice(names, func(i, j int) bool {
		a, b := p.rows[names[i]], p.rows[names[j]]
		if a.total != b.total {
			return a.total > b.total
		}
		if a.first != b.first {
			return a.first > b.first
		}
		return names[i] < names[j]
	})
	wall := time.Since(p.start)
	fmt.Fprintf(w, "KEEL_CUDA_PROFILE: %s: device work (and the driver's allocation calls) %.3f s after each row's first call, and %.3f s in first calls (plans, lazy loading), of %.3f s since the device opened\n",
		device, sum.Seconds(), firsts.Seconds(), wall.Seconds())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "kernel or product\tcalls after the first\ttotal ms\tmean µs\tshare\tfirst µs\t")
	for i, n := range names {
		if i == 60 {
			fmt.Fprintf(tw, "(%d more)\t\t\t\t\t\t\n", len(names)-i)
			break
		}
		r := p.rows[n]
		mean := "-"
		if r.calls > 0 {
			mean = fmt.Sprintf("%.1f", float64(r.total.Nanoseconds())/1e3/float64(r.calls))
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%s\t%.1f%%\t%.1f\t\n", n, r.calls, float64(r.total.Nanoseconds())/1e6, mean,
			100*r.total.Seconds()/max(sum.Seconds(), 1e-12), float64(r.first.Nanoseconds())/1e3)
	}
	tw.Flush()
}
