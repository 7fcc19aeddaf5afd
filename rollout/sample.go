package rollout

import (
	"math"
	"math/rand/v2"
	"slices"

	"github.com/keel-rl/keel/kernels"
)

// The sampling maths, the same whatever the backend: a policy draws each
// token from the log-probabilities a Backend's Step leaves for an output
// row (StepBatch.LogProbs), with the sequence's own random stream.

// policy is a group's sampling settings, with the stop set laid out for
// the per-token check. Groups of one Generate call share one.
type policy struct {
	sp      Sampling
	stop    [256]bool // stop tokens below 256, for a fast check
	stopAll []int32
}

func newPolicy(sp Sampling) *policy {
	pl := &policy{sp: sp}
	for _, t := range sp.Stop {
		if t < 256 {
			pl.stop[t] = true
		} else {
			pl.stopAll = append(pl.stopAll, t)
		}
	}
	return pl
}

// isStop reports whether t is one of the policy's stop tokens.
func (pl *policy) isStop(t int32) bool {
	if t < 256 {
		return pl.stop[t]
	}
	return slices.Contains(pl.stopAll, t)
}

// topTokens fills top with the len(top) largest entries of z, largest
// first, the lower id first among equal values: one pass with an
// insertion into a short sorted list.
func topTokens(top []TokenLogProb, z []float32) {
	n := 0
	for i, v := range z {
		if n == len(top) && !(v > top[n-1].LogProb) {
			continue
		}
		j := min(n, len(top)-1)
		for j > 0 && v > top[j-1].LogProb {
			top[j] = top[j-1]
			j--
		}
		top[j] = TokenLogProb{Token: int32(i), LogProb: v}
		if n < len(top) {
			n++
		}
	}
}

// sampleOne draws a token from the log-probabilities z (already at the
// sampling temperature) with rng, returning it with its log-probability
// under z and under the truncated distribution. ids and p are scratch of
// len(z) (ids only needed with truncation).
//
// The draw is inverse-CDF: one uniform u in [0, 1) against the running
// float64 sum of p = exp(z) in token order (drawFull; in descending
// probability over the kept set under truncation), scaled by the total, so
// that the few ulps by which Σ exp(z) misses 1 never bias the last token.
func (pl *policy) sampleOne(z []float32, rng *rand.PCG, ids []int32, p []float32) (int32, float32, float32) {
	if pl.sp.Temperature == 0 {
		best, lp := greedy(z)
		return best, lp, 0
	}
	u := uniform(rng)
	p = p[:len(z)]
	if !pl.sp.Truncated() {
		i := drawFull(z, p, u)
		return int32(i), z[i], z[i]
	}
	i, tlp := drawTruncated(z, p, ids, u, pl.sp.TopK, pl.sp.TopP)
	return i, z[i], tlp
}

// drawTruncated draws by DrawTruncated's rule with the scratch p and ids
// (len(z) each), returning the token and its truncated log-probability.
func drawTruncated(z, p []float32, ids []int32, u float64, topK int, topP float64) (int32, float32) {
	kernels.Exp(p, z)
	cand := candidates(z, p, ids, topK, topP)
	var kept float64
	for _, id := range cand {
		kept += float64(p[id])
	}
	target := u * kept
	var cum float64
	pick := cand[len(cand)-1]
	for _, id := range cand {
		cum += float64(p[id])
		if cum > target {
			pick = id
			break
		}
	}
	return pick, float32(float64(z[pick]) - math.Log(kept))
}

// uniform is a draw's uniform in [0, 1): 53 random bits.
func uniform(rng *rand.PCG) float64 { return float64(rng.Uint64()>>11) * 0x1p-53 }

// drawBlock is the number of tokens whose probabilities drawFull sums in
// one vectorised pass.
const drawBlock = 512

// drawFull returns the token at which the running sum of p = exp(z)
// first exceeds u times the total (inverse CDF over the full distribution,
// token order), writing p. Sums are float64: each block of drawBlock
// tokens is exponentiated and summed in one vectorised pass (the float64
// sum's lane order fixed by the block's length), the blocks are added in
// order, and only the block where the draw lands is scanned token by
// token, so a 151,936-token row costs one vector pass, not two scalar
// ones. The result depends only on z and u. Tokens of probability 0 are
// never drawn; if rounding leaves the target unreached, the last token of
// non-zero probability is.
func drawFull(z, p []float32, u float64) int {
	nb := (len(z) + drawBlock - 1) / drawBlock
	var sumsArr [512]float64
	sums := sumsArr[:0]
	if nb > len(sumsArr) {
		sums = make([]float64, 0, nb)
	}
	var total float64
	for b := 0; b < nb; b++ {
		lo, hi := b*drawBlock, min((b+1)*drawBlock, len(z))
		s := kernels.ExpSum(p[lo:hi], z[lo:hi], 0)
		sums = append(sums, s)
		total += s
	}
	target := u * total
	var cum float64
	b := 0
	for ; b < nb && cum+sums[b] <= target; b++ {
		cum += sums[b]
	}
	// Token by token from the block where the draw lands (on past it in
	// the rare case that the block's tokens summed one by one fall short
	// of its vectorised sum).
	for i := b * drawBlock; i < len(p); i++ {
		if p[i] == 0 {
			continue
		}
		cum += float64(p[i])
		if cum > target {
			return i
		}
	}
	for i := len(p) - 1; i > 0; i-- {
		if p[i] != 0 {
			return i
		}
	}
	return 0
}

// insertionTopK is the largest top-k that candidates takes by insertion
// into a sorted prefix (O(V k)); beyond it, by sorting the row.
const insertionTopK = 64

// candidates returns the truncated set in descending probability (ties:
// lower id first): the top-k (k = topK, off unless 0 < k < len(z)), then
// cut to the smallest prefix whose probability (p = exp(z)) reaches tp
// (off unless 0 < tp < 1).
func candidates(z, p []float32, buf []int32, topK int, tp float64) []int32 {
	var cand []int32
	if k := topK; k > 0 && k < len(z) && k <= insertionTopK {
		// Insertion into a sorted prefix of k: cheap for a small k.
		cand = buf[:0]
		for i := range z {
			id := int32(i)
			if len(cand) == k && !before(z, id, cand[k-1]) {
				continue
			}
			if len(cand) < k {
				cand = append(cand, id)
			} else {
				cand[k-1] = id
			}
			for j := len(cand) - 1; j > 0 && before(z, cand[j], cand[j-1]); j-- {
				cand[j], cand[j-1] = cand[j-1], cand[j]
			}
		}
	} else {
		if tp > 0 && tp < 1 {
			cand = topPPrefix(z, p, buf, tp)
		}
		if cand == nil {
			cand = buf[:len(z)]
			for i := range cand {
				cand[i] = int32(i)
			}
			sortByProb(cand, z)
		}
		if topK > 0 && topK < len(cand) {
			cand = cand[:topK]
		}
	}
	if tp > 0 && tp < 1 {
		var cum float64
		for i, id := range cand {
			cum += float64(p[id])
			if cum >= tp {
				return cand[:i+1]
			}
		}
	}
	return cand
}

// topPBins and topPSpan are topPPrefix's histogram: topPBins bins of
// log-probability over the topPSpan nats below the row's largest.
const (
	topPBins = 64
	topPSpan = 32
)

// topPPrefix returns, sorted by before, a prefix of z's tokens in that
// order whose probabilities (p = exp(z)) sum past tp with room to spare
// for rounding, so that top-p's cut lies inside it and sorting it alone
// gives the cut sorting the whole row gives, bit for bit: the tokens in
// the first bins of a histogram of log-probabilities below the largest,
// as many bins as reach tp. A bin holds a range of values, so the tokens
// up to a bin are a prefix of the order. nil where no bin reaches tp
// (a row whose mass lies far below its largest, or NaN): the caller
// sorts the whole row. A trained model's top-p keeps tens or hundreds of
// tokens, so this sorts those instead of 151,936.
func topPPrefix(z, p []float32, buf []int32, tp float64) []int32 {
	mx := float32(math.Inf(-1))
	for _, v := range z {
		mx = max(mx, v)
	}
	bin := func(v float32) int { // -1: below the histogram
		if !(v >= mx-topPSpan) {
			return -1
		}
		return min(int((mx-v)*(topPBins/topPSpan)), topPBins-1)
	}
	var mass [topPBins]float64
	for i, v := range z {
		if b := bin(v); b >= 0 {
			mass[b] += float64(p[i])
		}
	}
	// Summed in another order than the sorted one, a bin's total may
	// differ from the sorted running sum by rounding (under 1e-11 of it).
	need := tp + 1e-9
	var cum float64
	last := -1
	for b, m := range mass {
		if cum += m; cum >= need {
			last = b
			break
		}
	}
	if last < 0 {
		return nil
	}
	cand := buf[:0]
	for i, v := range z {
		if b := bin(v); b >= 0 && b <= last {
			cand = append(cand, int32(i))
		}
	}
	sortByProb(cand, z)
	return cand
}

// before reports whether token a ranks before token b: more probable, or
// as probable with a lower id.
func before(z []float32, a, b int32) bool {
	if z[a] != z[b] {
		return z[a] > z[b]
	}
	return a < b
}

// sortByProb sorts ids by before (a heap sort: in place, no allocation,
// no closure, O(n log n) in the worst case).
func sortByProb(ids []int32, z []float32) {
	n := len(ids)
	// Build a heap whose root ranks last, then move roots to the end.
	for i := n/2 - 1; i >= 0; i-- {
		siftDown(ids, z, i, n)
	}
	for end := n - 1; end > 0; end-- {
		ids[0], ids[end] = ids[end], ids[0]
		siftDown(ids, z, 0, end)
	}
}

func siftDown(ids []int32, z []float32, i, n int) {
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if c+1 < n && before(z, ids[c], ids[c+1]) {
			c++ // the child that ranks later
		}
		if !before(z, ids[i], ids[c]) {
			return
		}
		ids[i], ids[c] = ids[c], ids[i]
		i = c
	}
}
