// Command gospeed times keel's tokenizer encoding a text file in one call,
// single-threaded (best of three): keel's side of tools/tokgold/speed.sh.
//
//	go run ./tools/tokgold/gospeed TOKENIZER.json TEXT_FILE
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/keel-rl/keel/tokenizer"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: gospeed TOKENIZER.json TEXT_FILE")
		os.Exit(2)
	}
	runtime.GOMAXPROCS(1)
	tok, err := tokenizer.Load(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	b, err := os.ReadFile(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The chunks of speed.js: consecutive lines until one holds at least
	// 4096 bytes.
	var chunks []string
	cur := 0
	for i := 0; i < len(b); i++ {
		if b[i] == '\n' && i+1-cur >= 4096 {
			chunks = append(chunks, string(b[cur:i+1]))
			cur = i + 1
		}
	}
	if cur < len(b) {
		chunks = append(chunks, string(b[cur:]))
	}
	tok.Encode("warm up")
	best, n := time.Duration(1<<62), 0
	for r := 0; r < 3; r++ {
		start := time.Now()
		n = 0
		for _, c := range chunks {
			n += len(tok.Encode(c))
		}
		best = min(best, time.Since(start))
	}
	out, _ := json.Marshal(map[string]any{"bytes": len(b), "tokens": n, "seconds": best.Seconds(), "mb_per_s": float64(len(b)) / 1e6 / best.Seconds()})
	fmt.Println(string(out))
}
