package rollout

// PromptSeed returns the seed s' for which Generate([][]int32{prompts[i]},
// n, sp with Seed s') draws exactly the samples of prompt i in
// Generate(prompts, n, sp with Seed seed): sample j of prompt p draws from
// the stream keyed by splitmix64(Seed ^ splitmix64(p)) and j (see admit),
// so a one-prompt call (p = 0) needs s' ^ splitmix64(0) = seed ^
// splitmix64(i).
//
// It exists so that a rollout spread over several inference servers, one
// prompt per request, gives the samples of one local Generate call
// whatever the number of servers and whichever server answers: each
// request carries its prompt's seed.
func PromptSeed(seed uint64, i int) uint64 {
	return seed ^ splitmix64(uint64(i)) ^ splitmix64(0)
}
