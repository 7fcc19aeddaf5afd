package rl

import (
	"math/rand/v2"

	"github.com/keel-rl/keel/data"
)

// Prompt is one data-set row ready for the rollout engine.
type Prompt struct {
	Row     int          // row in the data set, from 0
	IDs     []int32      // the ChatML prompt with the generation prompt
	Example data.Example // task, answer (the verifier's ground truth), text
}

// LoaderState is where a Loader stands: the epoch and how many prompts of
// that epoch's order were taken. A checkpoint saves it, so a resumed run
// sees the same prompts as one that never stopped.
type LoaderState struct {
	Epoch  int `json:"epoch"`
	Cursor int `json:"cursor"`
}

// Loader deals prompts in a fresh order every epoch, drawn from the seed
// and the epoch number alone, so its state is two integers.
type Loader struct {
	prompts []Prompt
	seed    uint64
	st      LoaderState
	order   []int
	rows    map[int]int // Row → index in prompts, built on first use
}

// NewLoader returns a loader over prompts (at least one).
func NewLoader(prompts []Prompt, seed uint64) *Loader {
	l := &Loader{prompts: prompts, seed: seed}
	l.Seek(LoaderState{})
	return l
}

// State returns where the loader stands.
func (l *Loader) State() LoaderState { return l.st }

// Seek moves the loader to st.
func (l *Loader) Seek(st LoaderState) {
	if st.Cursor < 0 || st.Cursor > len(l.prompts) {
		st.Cursor = 0
	}
	l.st = st
	r := rand.New(rand.NewPCG(l.seed, 0x9e3779b9^uint64(st.Epoch)))
	l.order = r.Perm(len(l.prompts))
}

// Next returns the next n prompts, crossing into the next epoch (a new
// order) when this one runs out.
func (l *Loader) Next(n int) []*Prompt {
	out := make([]*Prompt, 0, n)
	for len(out) < n {
		if l.st.Cursor >= len(l.prompts) {
			l.Seek(LoaderState{Epoch: l.st.Epoch + 1})
		}
		out = append(out, &l.prompts[l.order[l.st.Cursor]])
		l.st.Cursor++
	}
	return out
}

// byRow returns the prompt of data-set row row.
func (l *Loader) byRow(row int) (*Prompt, bool) {
	if l.rows == nil {
		l.rows = make(map[int]int, len(l.prompts))
		for i, p := range l.prompts {
			l.rows[p.Row] = i
		}
	}
	i, ok := l.rows[row]
	if !ok {
		return nil, false
	}
	return &l.prompts[i], true
}
