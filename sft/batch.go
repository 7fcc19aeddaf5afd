// Package sft is supervised fine-tuning (and training from scratch) on
// (prompt, response) pairs: the cold start that gives RL a model which can
// already solve some problems. The loss is the mean negative log-likelihood
// of the response tokens; prompt tokens are context only.
package sft

import (
	"fmt"
	"math/rand/v2"
)

// Example is one supervised pair as token ids. The model sees
// Prompt+Response and is trained to predict every Response token outside
// Masked.
type Example struct {
	Prompt, Response []int32
	// Masked are ranges [a, b) of Response not trained on: the
	// observations of a multi-turn demonstration, which an environment
	// writes, not the model.
	Masked [][2]int
}

// masked reports whether Response[j] is masked.
func (e Example) masked(j int) bool {
	for _, m := range e.Masked {
		if j >= m[0] && j < m[1] {
			return true
		}
	}
	return false
}

// Len is the example's sequence length.
func (e Example) Len() int { return len(e.Prompt) + len(e.Response) }

// Position is where a Batcher stands in its data: the epoch and the number
// of examples of that epoch's order already used. It is what a checkpoint
// saves so a resumed run sees the same batches.
type Position struct {
	Epoch  int `json:"epoch"`
	Cursor int `json:"cursor"`
}

// Batcher cuts a data set into batches of about a token budget, visiting
// the examples of every epoch in a fresh order drawn from the seed and the
// epoch number alone (so a position fully determines what comes next).
type Batcher struct {
	data   []Example
	budget int
	seed   uint64
	pos    Position
	order  []int // the current epoch's permutation
}

// NewBatcher returns a batcher over data with batches of at most budget
// tokens (at least one example each). Every example must fit the budget.
func NewBatcher(data []Example, budget int, seed uint64) (*Batcher, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("sft: no training examples")
	}
	if budget <= 0 {
		return nil, fmt.Errorf("sft: batch_tokens = %d, want > 0", budget)
	}
	for i, e := range data {
		if len(e.Response) == 0 || e.Len() < 2 {
			return nil, fmt.Errorf("sft: example %d has no response token to predict", i)
		}
		if e.Len() > budget {
			return nil, fmt.Errorf("sft: example %d has %d tokens, more than batch_tokens = %d", i, e.Len(), budget)
		}
	}
	b := &Batcher{data: data, budget: budget, seed: seed}
	b.Seek(Position{})
	return b, nil
}

// Position returns where the batcher stands.
func (b *Batcher) Position() Position { return b.pos }

// Seek moves the batcher to p (as saved by a checkpoint).
func (b *Batcher) Seek(p Position) {
	if p.Cursor < 0 || p.Cursor > len(b.data) {
		p.Cursor = 0
	}
	b.pos = p
	b.order = permutation(len(b.data), b.seed, p.Epoch)
}

func permutation(n int, seed uint64, epoch int) []int {
	r := rand.New(rand.NewPCG(seed, 0x5f7a11ed^uint64(epoch)))
	return r.Perm(n)
}

// Next returns the next batch: examples in the current order until the
// token budget would be exceeded. An epoch's last batch may be short; the
// next call starts the next epoch.
func (b *Batcher) Next() []Example {
	if b.pos.Cursor >= len(b.data) {
		b.Seek(Position{Epoch: b.pos.Epoch + 1})
	}
	var out []Example
	tokens := 0
	for b.pos.Cursor < len(b.data) {
		e := b.data[b.order[b.pos.Cursor]]
		if len(out) > 0 && tokens+e.Len() > b.budget {
			break
		}
		out = append(out, e)
		tokens += e.Len()
		b.pos.Cursor++
	}
	return out
}
