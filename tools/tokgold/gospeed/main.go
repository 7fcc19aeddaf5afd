// Command gospeed times keel's tokenizer encoding a text file, single
// threaded, cut into the chunks of speed.js (consecutive lines until a
// chunk holds at least 4096 bytes): keel's side of tools/tokgold/speed.sh.
// With a third argument, the ids Hugging Face gave (int32 little-endian,
// all chunks in order), it checks keel's ids against them.
//
//	go run ./tools/tokgold/gospeed TOKENIZER.json TEXT_FILE [IDS_FILE]
package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/keel-rl/keel/tokenizer"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "gospeed:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 2 && len(args) != 3 {
		return fmt.Errorf("usage: gospeed TOKENIZER.json TEXT_FILE [IDS_FILE]")
	}
	runtime.GOMAXPROCS(1)
	tok, err := tokenizer.Load(args[0])
	if err != nil {
		return err
	}
	b, err := os.ReadFile(args[1])
	if err != nil {
		return err
	}
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
	runtime.GC() // the garbage of loading is not the encoder's
	var secs []float64
	var ids []int32
	for r := 0; r < 4; r++ {
		start := time.Now()
		ids = ids[:0]
		for _, c := range chunks {
			ids = append(ids, tok.Encode(c)...)
		}
		secs = append(secs, time.Since(start).Seconds())
	}
	same := "not checked"
	if len(args) == 3 {
		raw, err := os.ReadFile(args[2])
		if err != nil {
			return err
		}
		want := make([]int32, len(raw)/4)
		for i := range want {
			want[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		same = "yes"
		if len(want) != len(ids) {
			same = fmt.Sprintf("no: %d ids, Hugging Face %d", len(ids), len(want))
		} else {
			for i := range ids {
				if ids[i] != want[i] {
					same = fmt.Sprintf("no: first difference at id %d", i)
					break
				}
			}
		}
	}
	mb := float64(len(b)) / 1e6
	best := min(secs[0], secs[1], secs[2], secs[3])
	out, _ := json.Marshal(map[string]any{"bytes": len(b), "chunks": len(chunks), "tokens": len(ids),
		"first_mb_per_s": mb / secs[0], "best_mb_per_s": mb / best, "same_ids_as_hf": same})
	fmt.Println(string(out))
	return nil
}
