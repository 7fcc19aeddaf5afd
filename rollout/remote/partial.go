package remote

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/keel-rl/keel/rollout"
)

// pollSwitch is how often GenerateSwitching asks for newer weights while
// its requests are in flight.
const pollSwitch = 2 * time.Millisecond

// GenerateSwitching is Generate with weight updates in flight (partial
// rollouts, Options.InPlace): while the requests run, it asks next for
// newer weights and pushes any to every server in place, so that the
// sequences in flight continue on them; each sample says which version
// sampled each token (Sample.TokenVersions), its Version is its first
// token's. next is called from a goroutine of its own, never concurrently
// with itself; a Switch it returns is released once pushed, saying
// whether some server loaded it (those that failed are dropped).
func (r *Client) GenerateSwitching(prompts [][]int32, n int, sp rollout.Sampling, next func() *rollout.Switch) ([]rollout.Sample, error) {
	if !r.opt.InPlace {
		return nil, errors.New("rollout: weights changing during a remote rollout need in-place pushes (remote.Options.InPlace, kind keel)")
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var pushErr error
	wg.Go(func() {
		t := time.NewTicker(pollSwitch)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			select {
			case <-stop: // the generation ended meanwhile: no push for nothing
				return
			default:
			}
			sw := next()
			if sw == nil {
				continue
			}
			err := r.UpdateWeights(context.Background(), sw.Model, sw.Version)
			if sw.Release != nil {
				sw.Release(err == nil)
			}
			if err != nil && pushErr == nil {
				pushErr = err
			}
		}
	})
	out, err := r.Generate(prompts, n, sp)
	close(stop)
	wg.Wait()
	if err == nil {
		err = pushErr
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}
