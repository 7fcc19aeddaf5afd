package rollout

// PromptSeed returns the seed s' for which Generate([][]int32{prompts[i]},
// n, sp with Seed s') draws exactly the samples of prompt i in
// Generate(prompts, n, sp with Seed seed): sample j of prompt p draws from
// the stream keyed by Splitmix64(Seed ^ Splitmix64(p)) and SampleStream(j)
// (see admit), so a one-prompt call (p = 0) needs s' ^ Splitmix64(0) =
// seed ^ Splitmix64(i).
//
// It exists so that a rollout spread over several inference servers, one
// prompt per request, gives the samples of one local Generate call
// whatever the number of servers and whichever server answers: each
// request carries its prompt's seed.
func PromptSeed(seed uint64, i int) uint64 {
	return seed ^ Splitmix64(uint64(i)) ^ Splitmix64(0)
}

// Splitmix64 scrambles x into a well-separated stream key (Steele, Lea and
// Flood's SplitMix64 finaliser: Splitmix64(0) is 0xe220a8397b1dcdaf, the
// first output of the reference generator seeded with 0). Every seed the
// engine derives goes through it; it is exported so that a client of
// remote servers derives its seeds with the engine's mixer rather than a
// copy that could drift.
func Splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// sampleStreamSalt keeps sample streams apart from prompt keys, which are
// Splitmix64 of small integers too.
const sampleStreamSalt = 0x632be59bd9b4e019

// SampleStream returns the second key of sample j's random stream: sample
// j of prompt i in a Generate call with seed Seed draws from the PCG stream
// (Splitmix64(Seed ^ Splitmix64(i)), SampleStream(j)), whatever slot it
// gets. It is exported so that a server that cannot draw sample j of one
// request from that stream (SGLang hashes one seed per request) can be given
// a per-sample seed derived from the same key.
func SampleStream(j int) uint64 {
	return Splitmix64(uint64(j) + sampleStreamSalt)
}
