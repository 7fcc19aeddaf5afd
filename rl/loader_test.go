package rl

import (
	"encoding/json"
	"slices"
	"testing"
)

func loaderPrompts(n int) []Prompt {
	p := make([]Prompt, n)
	for i := range p {
		p[i] = Prompt{Row: i, IDs: []int32{int32(i)}}
	}
	return p
}

// loaderRows takes n prompts in chunks of chunk and returns their rows,
// checking that each is a pointer into prompts.
func loaderRows(t *testing.T, l *Loader, prompts []Prompt, n, chunk int) []int {
	t.Helper()
	var rows []int
	for len(rows) < n {
		k := min(chunk, n-len(rows))
		got := l.Next(k)
		if len(got) != k {
			t.Fatalf("Next(%d) returned %d prompts", k, len(got))
		}
		for _, p := range got {
			if p != &prompts[p.Row] {
				t.Fatalf("Next returned a prompt (row %d) that is not the loader's own", p.Row)
			}
			rows = append(rows, p.Row)
		}
	}
	return rows
}

func TestLoaderEpochs(t *testing.T) {
	const n = 10
	prompts := loaderPrompts(n)
	l := NewLoader(prompts, 42)
	if st := l.State(); st != (LoaderState{}) {
		t.Fatalf("a new loader stands at %+v, want the zero state", st)
	}
	rows := loaderRows(t, l, prompts, 3*n, 3)
	identity := make([]int, n)
	for i := range identity {
		identity[i] = i
	}
	var epochs [][]int
	for e := range 3 {
		ep := rows[e*n : (e+1)*n]
		epochs = append(epochs, ep)
		sorted := slices.Sorted(slices.Values(ep))
		if !slices.Equal(sorted, identity) {
			t.Errorf("epoch %d deals %v: not every prompt exactly once", e, ep)
		}
	}
	if slices.Equal(epochs[0], epochs[1]) || slices.Equal(epochs[1], epochs[2]) || slices.Equal(epochs[0], epochs[2]) {
		t.Errorf("epochs repeat an order: %v", epochs)
	}
	if slices.Equal(epochs[0], identity) && slices.Equal(epochs[1], identity) {
		t.Errorf("the prompts are not shuffled: %v", epochs)
	}
	if st := l.State(); st != (LoaderState{Epoch: 2, Cursor: n}) {
		t.Errorf("after 3 epochs the loader stands at %+v, want {2 %d}", st, n)
	}

	// The same seed deals the same sequence, whatever the chunk sizes.
	again := loaderRows(t, NewLoader(prompts, 42), prompts, 3*n, 7)
	if !slices.Equal(rows, again) {
		t.Errorf("seed 42 dealt\n%v\nthen\n%v", rows, again)
	}
	// Another seed deals another.
	other := loaderRows(t, NewLoader(prompts, 43), prompts, 3*n, 3)
	if slices.Equal(rows, other) {
		t.Errorf("seeds 42 and 43 dealt the same %v", rows)
	}
}

func TestLoaderEpochBoundary(t *testing.T) {
	prompts := loaderPrompts(10)
	ref := loaderRows(t, NewLoader(prompts, 5), prompts, 20, 20)

	l := NewLoader(prompts, 5)
	l.Next(10)
	if st := l.State(); st != (LoaderState{Epoch: 0, Cursor: 10}) {
		t.Fatalf("after one epoch: %+v, want {0 10}", st)
	}
	if got := loaderRows(t, l, prompts, 1, 1); got[0] != ref[10] {
		t.Errorf("the first prompt of epoch 1 is %d, want %d", got[0], ref[10])
	}
	if st := l.State(); st != (LoaderState{Epoch: 1, Cursor: 1}) {
		t.Errorf("after the first prompt of epoch 1: %+v, want {1 1}", st)
	}

	// Seeking to the start of epoch 1 deals epoch 1's order.
	l = NewLoader(prompts, 5)
	l.Seek(LoaderState{Epoch: 1})
	if got := loaderRows(t, l, prompts, 10, 4); !slices.Equal(got, ref[10:]) {
		t.Errorf("epoch 1 from Seek: %v, want %v", got, ref[10:])
	}

	// One prompt: every Next deals it, one epoch per prompt.
	one := loaderPrompts(1)
	l = NewLoader(one, 5)
	if got := loaderRows(t, l, one, 5, 2); !slices.Equal(got, []int{0, 0, 0, 0, 0}) {
		t.Errorf("one prompt: %v", got)
	}
	if st := l.State(); st != (LoaderState{Epoch: 4, Cursor: 1}) {
		t.Errorf("one prompt, after 5: %+v, want {4 1}", st)
	}
}

func TestLoaderSeekResumes(t *testing.T) {
	prompts := loaderPrompts(10)
	const seed = 9
	for _, taken := range []int{0, 3, 10, 13, 27} {
		a := NewLoader(prompts, seed)
		a.Next(taken)
		st := a.State()

		// The state survives a checkpoint (JSON).
		b, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		var saved LoaderState
		if err := json.Unmarshal(b, &saved); err != nil {
			t.Fatal(err)
		}
		if saved != st {
			t.Fatalf("state %+v came back from JSON %s as %+v", st, b, saved)
		}

		restored := NewLoader(prompts, seed)
		restored.Next(4) // a restored loader may have dealt before
		restored.Seek(saved)
		if restored.State() != st {
			t.Errorf("after %d: Seek(%+v) stands at %+v", taken, st, restored.State())
		}
		self := NewLoader(prompts, seed)
		self.Next(taken)
		self.Seek(self.State())

		want := loaderRows(t, a, prompts, 25, 3)
		if got := loaderRows(t, restored, prompts, 25, 5); !slices.Equal(got, want) {
			t.Errorf("after %d: restored loader dealt\n%v\nwant\n%v", taken, got, want)
		}
		if got := loaderRows(t, self, prompts, 25, 25); !slices.Equal(got, want) {
			t.Errorf("after %d: Seek(State()) changed the continuation:\n%v\nwant\n%v", taken, got, want)
		}
		if a.State() != restored.State() || a.State() != self.State() {
			t.Errorf("after %d+25: states %+v %+v %+v differ", taken, a.State(), restored.State(), self.State())
		}
	}
}
