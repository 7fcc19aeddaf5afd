package tasks

import (
	"fmt"
	"sort"
	"strings"
)

// Verifier scores responses against a ground truth. Every Task is one; the
// verify-only verifiers (gsm8k, math) score data sets that keel does not
// generate, such as verl's Parquet files of GSM8K, MATH or DAPO-Math-17k.
type Verifier interface {
	// Name is the verifier's canonical name.
	Name() string
	// Score returns 1 if response's final answer is right for the ground
	// truth answer, else 0. It never fails.
	Score(answer, response string) float64
}

// Extractor is a Verifier that reports the final answer it reads from a
// response, so that its verdicts can be audited.
type Extractor interface {
	Verifier
	// Extract returns the final answer the verifier compares with the
	// ground truth; ok is false when the response has none or when the
	// verifier refuses it before comparing (answer may then still hold the
	// final marked answer).
	Extract(response string) (answer string, ok bool)
}

// verifiers holds the verify-only verifiers by every name they accept;
// prefixes holds names accepted by prefix (verl dispatches "aime*" so).
var (
	verifiers = map[string]Verifier{}
	prefixes  = map[string]Verifier{}
)

// registerVerifier adds a verify-only verifier under its name and aliases;
// an alias ending in '*' is a prefix.
func registerVerifier(v Verifier, aliases ...string) {
	verifiers[v.Name()] = v
	for _, a := range aliases {
		if p, ok := strings.CutSuffix(a, "*"); ok {
			prefixes[p] = v
		} else {
			verifiers[a] = v
		}
	}
}

// LookupVerifier returns the verifier of a task or data_source name: a
// generated family (see Names), or a verify-only verifier under any of the
// names verl's data sets carry (see VerifierNames).
func LookupVerifier(name string) (Verifier, error) {
	if t, ok := registry[name]; ok {
		return t, nil
	}
	if v, ok := verifiers[name]; ok {
		return v, nil
	}
	// The longest matching prefix wins.
	var best Verifier
	n := -1
	for p, v := range prefixes {
		if strings.HasPrefix(name, p) && len(p) > n {
			best, n = v, len(p)
		}
	}
	if best != nil {
		return best, nil
	}
	canon := map[string]bool{}
	for _, v := range verifiers {
		canon[v.Name()] = true
	}
	var vs []string
	for n := range canon {
		vs = append(vs, n)
	}
	sort.Strings(vs)
	return nil, fmt.Errorf("no verifier for task %q (known: %s; gsm8k and math also under verl's data_source names such as openai/gsm8k, lighteval/MATH, math_dapo, aime*, numina_*)",
		name, strings.Join(append(Names(), vs...), ", "))
}

// VerifierNames lists every name LookupVerifier accepts: the generated
// families, then the verify-only verifiers' names and aliases, a prefix
// shown as "name*".
func VerifierNames() []string {
	n := Names()
	var more []string
	for k := range verifiers {
		if _, ok := registry[k]; !ok {
			more = append(more, k)
		}
	}
	for p := range prefixes {
		more = append(more, p+"*")
	}
	sort.Strings(more)
	return append(n, more...)
}

// Extract returns the final answer that the named task's verifier reads
// from response (see Extractor); for a verifier that is not an Extractor,
// the answer FinalAnswer marks. ok is false for an unknown task.
func Extract(task, response string) (answer string, ok bool) {
	v, err := LookupVerifier(task)
	if err != nil {
		return "", false
	}
	if x, isX := v.(Extractor); isX {
		return x.Extract(response)
	}
	return FinalAnswer(response)
}
