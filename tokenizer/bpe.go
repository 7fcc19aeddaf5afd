package tokenizer

import (
	"fmt"
	"slices"
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
	ranks        pairTable   // (left, right) -> rank
	rules        []mergeRule // by rank
	byteLevel    bool
	byteID       [256]int32 // byte-level: the id of each byte's piece, -1 if none
	unk          int32      // unknown character's id, -1: dropped (as Hugging Face does without unk_token)
	fuseUnk      bool
	ignoreMerges bool // a pre-token that is a whole piece is that piece

	mu    sync.Mutex
	cache map[string][]int32 // pre-token -> ids
	arena []int32            // backing store of the cached ids

	scratch sync.Pool // *heapScratch
}

// mergeRule is one line of model.merges: left and right merge into id.
type mergeRule struct{ left, right, id int32 }

const (
	noRank       = ^uint32(0)
	idBits       = 21      // ids and ranks below 2^21 (2,097,152) pack into one uint64
	cacheWords   = 1 << 18 // cached pre-tokens before the cache starts over
	cacheMaxWord = 256     // longer pre-tokens are not cached
)

// smallWord is the number of symbols up to which merges scan an array;
// longer words use a heap (n log n, for runs of thousands of characters).
var smallWord = 48

// newBPE reads the model section; byteLevel says whether pre-tokens reach
// it as GPT-2's byte mapping.
func newBPE(m *modelJSON, byteLevel bool) (*bpe, error) {
	b := &bpe{vocab: m.Vocab, byteLevel: byteLevel, unk: -1, fuseUnk: m.FuseUnk,
		ignoreMerges: m.IgnoreMerges, cache: map[string][]int32{}}
	if len(m.Vocab) >= 1<<idBits || len(m.Merges) >= 1<<idBits {
		return nil, fmt.Errorf("model: %w: %d pieces and %d merges (keel takes fewer than %d of each)", ErrUnsupported, len(m.Vocab), len(m.Merges), 1<<idBits)
	}
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
	b.ranks = newPairTable(len(m.Merges))
	b.rules = make([]mergeRule, len(m.Merges))
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
		b.rules[i] = mergeRule{l, r, id}
		// A pair listed twice keeps its last rank, as in Hugging Face.
		b.ranks.put(l, r, uint32(i))
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

func (m *bpe) lookup(a, b int32) uint32 { return m.ranks.get(a, b) }

// pairTable maps a pair of ids to its merge rank: open addressing, linear
// probing, at most half full, each slot one uint64 (left, right, rank in
// 21 bits each), so a probe reads 8 bytes of a table of a few MB, where
// Go's map costs about twice as much on this hot path.
type pairTable struct {
	slots []uint64
	shift uint
}

const (
	emptySlot = ^uint64(0) // no packed entry has the top bit set
	idMask    = 1<<idBits - 1
)

func newPairTable(n int) pairTable {
	bits := uint(4)
	for 1<<bits < 2*n {
		bits++
	}
	t := pairTable{slots: make([]uint64, 1<<bits), shift: 64 - bits}
	for i := range t.slots {
		t.slots[i] = emptySlot
	}
	return t
}

func pairKey(a, b int32) uint64 { return uint64(a)<<idBits | uint64(b) }

func (t *pairTable) index(key uint64) uint64 { return (key * 0x9E3779B97F4A7C15) >> t.shift }

// put sets the rank of (a, b), replacing an earlier one.
func (t *pairTable) put(a, b int32, rank uint32) {
	key := pairKey(a, b)
	mask := uint64(len(t.slots) - 1)
	for i := t.index(key); ; i = (i + 1) & mask {
		if s := t.slots[i]; s == emptySlot || s>>idBits == key {
			t.slots[i] = key<<idBits | uint64(rank)
			return
		}
	}
}

// get returns the rank of (a, b), or noRank.
func (t *pairTable) get(a, b int32) uint32 {
	key := pairKey(a, b)
	mask := uint64(len(t.slots) - 1)
	for i := t.index(key); ; i = (i + 1) & mask {
		s := t.slots[i]
		if s>>idBits == key {
			return uint32(s & idMask)
		}
		if s == emptySlot {
			return noRank
		}
	}
}

// mergeSmall merges syms in place by scanning an array of pair ranks and
// returns the number of symbols left.
func (m *bpe) mergeSmall(syms []int32) int {
	var buf [64]uint32
	n := len(syms)
	rank := buf[:0]
	if n-1 > len(buf) {
		rank = make([]uint32, 0, n-1)
	}
	for i := 0; i+1 < n; i++ {
		rank = append(rank, m.lookup(syms[i], syms[i+1]))
	}
	for n > 1 {
		best, at := noRank, -1
		for i, r := range rank[:n-1] {
			if r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		syms[at] = m.rules[best].id
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

// heapScratch is mergeHeap's working memory, pooled.
type heapScratch struct {
	next, prev []int32
	heap       heapU64
}

// mergeHeap merges syms in place with a linked list and a min-heap of
// candidate pairs (rank, left position); an entry whose pair has changed
// since it was pushed is skipped when popped. It returns the number of
// symbols left.
func (m *bpe) mergeHeap(syms []int32) int {
	n := len(syms)
	sc, _ := m.scratch.Get().(*heapScratch)
	if sc == nil {
		sc = &heapScratch{}
	}
	defer m.scratch.Put(sc)
	next, prev := slices.Grow(sc.next[:0], n)[:n], slices.Grow(sc.prev[:0], n)[:n] // next: -1 last, -2 merged away
	sc.next, sc.prev = next, prev
	h := sc.heap[:0]
	for i := range n {
		next[i], prev[i] = int32(i+1), int32(i-1)
		if i+1 < n {
			if r := m.lookup(syms[i], syms[i+1]); r != noRank {
				h = h.push(uint64(r)<<32 | uint64(i))
			}
		}
	}
	next[n-1] = -1
	for len(h) > 0 {
		var top uint64
		top, h = h.pop()
		rule, pos := m.rules[top>>32], int32(uint32(top))
		nx := next[pos]
		if nx < 0 || syms[pos] != rule.left || syms[nx] != rule.right {
			continue // merged away, now last, or the pair changed
		}
		syms[pos] = rule.id
		nn := next[nx]
		next[pos], next[nx] = nn, -2
		if nn >= 0 {
			prev[nn] = pos
			if r := m.lookup(syms[pos], syms[nn]); r != noRank {
				h = h.push(uint64(r)<<32 | uint64(pos))
			}
		}
		if p := prev[pos]; p >= 0 {
			if r := m.lookup(syms[p], syms[pos]); r != noRank {
				h = h.push(uint64(r)<<32 | uint64(p))
			}
		}
	}
	sc.heap = h
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
