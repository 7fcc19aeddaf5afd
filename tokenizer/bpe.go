package tokenizer

import (
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// bpe is a BPE model over ids: a pre-token becomes the ids of its bytes
// (byte-level) or characters, then the pair of adjacent ids with the
// lowest merge rank is merged, leftmost first, until no pair merges; as
// Hugging Face's BPE model does.
type bpe struct {
	vocab        map[string]int32
	merges       map[uint64]uint64 // left<<32 | right -> rank<<32 | merged id
	byteLevel    bool
	byteID       [256]int32 // byte-level: the id of each byte's piece, -1 if none
	unk          int32      // unknown character's id, -1: dropped (as Hugging Face does without unk_token)
	fuseUnk      bool
	ignoreMerges bool // a pre-token that is a whole piece is that piece

	mu    sync.Mutex
	cache map[string][]int32 // pre-token -> ids
	arena []int32            // backing store of the cached ids
}

const (
	noMerge      = ^uint64(0)
	cacheWords   = 1 << 18 // cached pre-tokens before the cache starts over
	cacheMaxWord = 256     // longer pre-tokens are not cached
)

// smallWord is the number of symbols up to which merges scan an array;
// longer words use a heap (n log n, for runs of thousands of characters).
var smallWord = 64

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// newBPE reads the model section; byteLevel says whether pre-tokens reach
// it as GPT-2's byte mapping.
func newBPE(m *modelJSON, byteLevel bool) (*bpe, error) {
	b := &bpe{vocab: m.Vocab, byteLevel: byteLevel, unk: -1, fuseUnk: m.FuseUnk,
		ignoreMerges: m.IgnoreMerges, cache: map[string][]int32{}}
	if m.UnkToken != nil {
		id, ok := m.Vocab[*m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model.unk_token: %q is not in model.vocab", *m.UnkToken)
		}
		b.unk = id
	}
	for i := range b.byteID {
		b.byteID[i] = -1
		if id, ok := m.Vocab[string(byteRune[i])]; ok {
			b.byteID[i] = id
		}
	}
	b.merges = make(map[uint64]uint64, len(m.Merges))
	for i, p := range m.Merges {
		l, okl := m.Vocab[p[0]]
		r, okr := m.Vocab[p[1]]
		id, ok := m.Vocab[p[0]+p[1]]
		switch {
		case !okl:
			return nil, fmt.Errorf("model.merges[%d]: %q is not in model.vocab", i, p[0])
		case !okr:
			return nil, fmt.Errorf("model.merges[%d]: %q is not in model.vocab", i, p[1])
		case !ok:
			return nil, fmt.Errorf("model.merges[%d]: the merged %q is not in model.vocab", i, p[0]+p[1])
		}
		// A pair listed twice keeps its last rank, as in Hugging Face.
		b.merges[pairKey(l, r)] = uint64(i)<<32 | uint64(uint32(id))
	}
	return b, nil
}

// encodeWord appends the ids of one pre-token, through the cache.
func (m *bpe) encodeWord(ids []int32, w string) []int32 {
	if len(w) > cacheMaxWord {
		return m.merge(ids, w)
	}
	m.mu.Lock()
	c, ok := m.cache[w]
	m.mu.Unlock()
	if ok {
		return append(ids, c...)
	}
	start := len(ids)
	ids = m.merge(ids, w)
	out := ids[start:]
	m.mu.Lock()
	if len(m.cache) >= cacheWords {
		clear(m.cache)
		m.arena = nil
	}
	if len(m.arena)+len(out) > cap(m.arena) {
		m.arena = make([]int32, 0, max(1<<14, len(out)))
	}
	n := len(m.arena)
	m.arena = append(m.arena, out...)
	m.cache[strings.Clone(w)] = m.arena[n:len(m.arena):len(m.arena)]
	m.mu.Unlock()
	return ids
}

// symbols appends the initial ids of w: its bytes' pieces (byte-level) or
// its characters, unknown ones as unk (consecutive ones fused with
// fuse_unk) or dropped.
func (m *bpe) symbols(syms []int32, w string) []int32 {
	lastUnk := false
	add := func(id int32, ok bool) {
		if ok {
			syms = append(syms, id)
			lastUnk = false
			return
		}
		if m.unk >= 0 && !(m.fuseUnk && lastUnk) {
			syms = append(syms, m.unk)
		}
		lastUnk = m.unk >= 0
	}
	if m.byteLevel {
		for i := 0; i < len(w); i++ {
			id := m.byteID[w[i]]
			add(id, id >= 0)
		}
		return syms
	}
	for i := 0; i < len(w); {
		_, n := utf8.DecodeRuneInString(w[i:])
		id, ok := m.vocab[w[i:i+n]]
		add(id, ok)
		i += n
	}
	return syms
}

// merge appends the ids of pre-token w.
func (m *bpe) merge(ids []int32, w string) []int32 {
	if m.ignoreMerges {
		key := w
		if m.byteLevel {
			key = byteLevelString(w)
		}
		if id, ok := m.vocab[key]; ok {
			return append(ids, id)
		}
	}
	start := len(ids)
	ids = m.symbols(ids, w)
	syms := ids[start:]
	if len(syms) < 2 {
		return ids
	}
	var n int
	if len(syms) <= smallWord {
		n = m.mergeSmall(syms)
	} else {
		n = m.mergeHeap(syms)
	}
	return ids[:start+n]
}

func (m *bpe) lookup(a, b int32) uint64 {
	if v, ok := m.merges[pairKey(a, b)]; ok {
		return v
	}
	return noMerge
}

// mergeSmall merges syms in place by scanning an array of pair ranks and
// returns the number of symbols left.
func (m *bpe) mergeSmall(syms []int32) int {
	var buf [64]uint64
	n := len(syms)
	rank := buf[:0]
	if n-1 > len(buf) {
		rank = make([]uint64, 0, n-1)
	}
	for i := 0; i+1 < n; i++ {
		rank = append(rank, m.lookup(syms[i], syms[i+1]))
	}
	for n > 1 {
		best, at := noMerge, -1
		for i, r := range rank[:n-1] {
			if r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		syms[at] = int32(uint32(best))
		copy(syms[at+1:n], syms[at+2:n])
		copy(rank[at:n-1], rank[at+1:n-1])
		n--
		if at > 0 {
			rank[at-1] = m.lookup(syms[at-1], syms[at])
		}
		if at < n-1 {
			rank[at] = m.lookup(syms[at], syms[at+1])
		}
	}
	return n
}

// mergeHeap merges syms in place with a linked list and a min-heap of
// candidate pairs (rank, left position); stale entries are skipped when
// popped. It returns the number of symbols left.
func (m *bpe) mergeHeap(syms []int32) int {
	n := len(syms)
	next := make([]int32, n) // -1: last; -2: merged away
	prev := make([]int32, n)
	var h heapU64
	for i := range n {
		next[i], prev[i] = int32(i+1), int32(i-1)
		if i+1 < n {
			if v := m.lookup(syms[i], syms[i+1]); v != noMerge {
				h = h.push(v&^0xffffffff | uint64(i))
			}
		}
	}
	next[n-1] = -1
	for len(h) > 0 {
		var top uint64
		top, h = h.pop()
		pos := int32(uint32(top))
		nx := next[pos]
		if nx < 0 {
			continue // merged away, or now the last symbol
		}
		v := m.lookup(syms[pos], syms[nx])
		if v == noMerge || v>>32 != top>>32 {
			continue // the pair changed since this entry was pushed
		}
		syms[pos] = int32(uint32(v))
		nn := next[nx]
		next[pos], next[nx] = nn, -2
		if nn >= 0 {
			prev[nn] = pos
			if w := m.lookup(syms[pos], syms[nn]); w != noMerge {
				h = h.push(w&^0xffffffff | uint64(pos))
			}
		}
		if p := prev[pos]; p >= 0 {
			if w := m.lookup(syms[p], syms[pos]); w != noMerge {
				h = h.push(w&^0xffffffff | uint64(p))
			}
		}
	}
	k := 0
	for i := int32(0); i >= 0; i = next[i] {
		syms[k] = syms[i]
		k++
	}
	return k
}

// heapU64 is a binary min-heap of uint64.
type heapU64 []uint64

func (h heapU64) push(v uint64) heapU64 {
	h = append(h, v)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if h[p] <= h[i] {
			break
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
	return h
}

func (h heapU64) pop() (uint64, heapU64) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l, r, s := 2*i+1, 2*i+2, i
		if l < len(h) && h[l] < h[s] {
			s = l
		}
		if r < len(h) && h[r] < h[s] {
			s = r
		}
		if s == i {
			break
		}
		h[s], h[i] = h[i], h[s]
		i = s
	}
	return top, h
}
