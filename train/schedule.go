package train

import (
	"fmt"
	"math"
)

// Schedule kinds.
const (
	// ScheduleConstant warms up linearly, then holds PeakLR: keel's default,
	// as docs/method.md §3 prescribes.
	ScheduleConstant = "constant"
	// ScheduleCosine warms up linearly, then decays from PeakLR to MinLR
	// along a half cosine, reaching MinLR at TotalSteps and staying there.
	ScheduleCosine = "cosine"
)

// Schedule gives the learning rate of every optimiser step.
type Schedule struct {
	Kind        string  // ScheduleConstant or ScheduleCosine ("" means constant)
	PeakLR      float64 // learning rate after warm-up
	WarmupSteps int     // steps 1..WarmupSteps ramp linearly up to PeakLR
	TotalSteps  int     // cosine only: the step at which MinLR is reached
	MinLR       float64 // cosine only: the floor
}

// Validate reports inconsistent settings.
func (s Schedule) Validate() error {
	switch s.Kind {
	case "", ScheduleConstant, ScheduleCosine:
	default:
		return fmt.Errorf("schedule: unknown kind %q (want %q or %q)", s.Kind, ScheduleConstant, ScheduleCosine)
	}
	if !(s.PeakLR >= 0) || math.IsInf(s.PeakLR, 0) {
		return fmt.Errorf("schedule: peak learning rate %g, want a finite value >= 0", s.PeakLR)
	}
	if s.WarmupSteps < 0 {
		return fmt.Errorf("schedule: warmup_steps = %d, want >= 0", s.WarmupSteps)
	}
	if s.Kind == ScheduleCosine {
		if s.TotalSteps <= s.WarmupSteps {
			return fmt.Errorf("schedule: cosine total_steps = %d must exceed warmup_steps = %d", s.TotalSteps, s.WarmupSteps)
		}
		if !(s.MinLR >= 0 && s.MinLR <= s.PeakLR) {
			return fmt.Errorf("schedule: min learning rate %g, want within [0, peak %g]", s.MinLR, s.PeakLR)
		}
	}
	return nil
}

// LR returns the learning rate of optimiser step `step`, counted from 1 (the
// value AdamW.Step will have after the update), so that the first step of a
// warm-up already moves the weights: PeakLR·step/WarmupSteps while step <=
// WarmupSteps. After warm-up the constant schedule returns PeakLR; the cosine
// schedule returns MinLR + (PeakLR−MinLR)·(1+cos(π·f))/2 with f =
// (step−WarmupSteps)/(TotalSteps−WarmupSteps), clamped to [0, 1]. Steps below
// 1 are treated as 1.
func (s Schedule) LR(step int) float64 {
	if step < 1 {
		step = 1
	}
	if step <= s.WarmupSteps {
		return s.PeakLR * float64(step) / float64(s.WarmupSteps)
	}
	if s.Kind != ScheduleCosine {
		return s.PeakLR
	}
	if s.TotalSteps <= s.WarmupSteps {
		return s.MinLR // an unvalidated, degenerate cosine: already at the floor
	}
	f := float64(step-s.WarmupSteps) / float64(s.TotalSteps-s.WarmupSteps)
	if f > 1 {
		f = 1
	}
	return s.MinLR + (s.PeakLR-s.MinLR)*0.5*(1+math.Cos(math.Pi*f))
}
