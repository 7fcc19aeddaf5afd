// Command sass compiles keel's embedded CUDA kernels to machine code for
// one architecture through keel's own NVRTC binding and, with NVIDIA's
// nvdisasm, prints each kernel's static instruction counts by opcode: a
// measure of an issue-bound kernel's work that needs no GPU, for
// comparing two versions of a kernel before a device session times them.
//
//	go run ./tools/sass -arch 90 -kernel 'flash_fwd_wq_128' flash.cu
//	go run ./tools/sass -loops -kernel 'flash_bwd_dq_2_128$' flash.cu  # each loop body's count
//	go run ./tools/sass -resources -kernel flash flash.cu               # registers and spills (no nvdisasm)
//	go run ./tools/sass -arch 90 -dump /tmp/sass flash.cu               # the .cubin and .sass files
//
// nvdisasm comes with the CUDA toolkit (Debian non-free's
// nvidia-cuda-toolkit: `apt-get download nvidia-cuda-toolkit && dpkg -x`
// it, then -nvdisasm PATH). Counts are static: a loop's body counts once,
// a loop inside it once too, and both sides of a branch count.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/keel-rl/keel/kernels/cuda"
)

func main() {
	arch := flag.Int("arch", 90, "compute capability times ten")
	kernel := flag.String("kernel", "", "regular expression: only the kernels it matches")
	dump := flag.String("dump", "", "folder to write each source's .cubin and .sass into")
	nvdisasm := flag.String("nvdisasm", "nvdisasm", "NVIDIA's disassembler")
	top := flag.Int("top", 12, "opcodes to list per kernel, most frequent first")
	flag.BoolVar(&loops, "loops", false, "also count each loop's body (a label to the branch back to it)")
	flag.BoolVar(&resources, "resources", false, "print ptxas's registers and spills for each kernel instead")
	flag.Parse()
	if err := run(flag.Args(), *arch, *kernel, *dump, *nvdisasm, *top); err != nil {
		fmt.Fprintln(os.Stderr, "sass:", err)
		os.Exit(1)
	}
}

// loops makes print count each loop's body too; resources prints
// ptxas's report instead of disassembling.
var loops, resources bool

// ptxasReport is one kernel's lines in ptxas's verbose log.
var ptxasReport = regexp.MustCompile(`Compiling entry function '(\w+)'[^\n]*\n(?:[^\n]*\n)*?[^\n]*?(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads\n[^\n]*Used (\d+) registers`)

func run(sources []string, arch int, kernel, dump, nvdisasm string, top int) error {
	if len(sources) == 0 {
		sources = cuda.SourceNames()
	}
	match, err := regexp.Compile(kernel)
	if err != nil {
		return fmt.Errorf("-kernel: %w", err)
	}
	n, err := cuda.LoadNVRTC()
	if err != nil {
		return err
	}
	for _, name := range sources {
		src, err := cuda.Source(name)
		if err != nil {
			return err
		}
		options := cuda.KernelOptions
		if resources {
			options = append(options[:len(options):len(options)], "--ptxas-options=-v")
		}
		image, log, err := n.Compile(src, name, cuda.Target{Arch: arch, Code: cuda.CodeCUBIN}, options...)
		if err != nil {
			return err
		}
		if resources {
			for _, m := range ptxasReport.FindAllStringSubmatch(log, -1) {
				if match.MatchString(m[1]) {
					fmt.Printf("%-28s sm_%d: %s registers, stack %s, spill stores %s, loads %s\n", m[1], arch, m[5], m[2], m[3], m[4])
				}
			}
			continue
		}
		dir := dump
		if dir == "" {
			if dir, err = os.MkdirTemp("", "keel-sass"); err != nil {
				return err
			}
			defer os.RemoveAll(dir)
		} else if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		base := filepath.Join(dir, strings.TrimSuffix(name, ".cu")+fmt.Sprintf("_sm%d", arch))
		if err := os.WriteFile(base+".cubin", image, 0o644); err != nil {
			return err
		}
		out, err := exec.Command(nvdisasm, "-c", base+".cubin").Output()
		if err != nil {
			return fmt.Errorf("%s %s.cubin: %w", nvdisasm, base, err)
		}
		if dump != "" {
			if err := os.WriteFile(base+".sass", out, 0o644); err != nil {
				return err
			}
		}
		for _, k := range parse(out) {
			if match.MatchString(k.name) {
				k.print(os.Stdout, top)
			}
		}
	}
	return nil
}

// function is one kernel's instructions counted by opcode (the mnemonic
// without its modifiers: FFMA, not FFMA.FTZ).
type function struct {
	name   string
	total  int
	counts map[string]int
	ops    []string       // the instructions' opcodes in order
	labels map[string]int // a label's position in ops
	loops  [][3]int       // a loop's first and last instruction, and its label's number
}

var (
	funcLine = regexp.MustCompile(`^\s*\.text\.(\w+):`)
	instLine = regexp.MustCompile(`/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)`)
	label    = regexp.MustCompile(`^\.L_x_(\d+):`)
	branch   = regexp.MustCompile(`\bBRA\b.*\.L_x_(\d+)`)
)

func parse(sass []byte) []*function {
	var fs []*function
	var cur *function
	for _, line := range bytes.Split(sass, []byte("\n")) {
		if m := funcLine.FindSubmatch(line); m != nil {
			cur = &function{name: string(m[1]), counts: map[string]int{}, labels: map[string]int{}}
			fs = append(fs, cur)
			continue
		}
		if cur == nil {
			continue
		}
		if m := label.FindSubmatch(line); m != nil {
			cur.labels[string(m[1])] = len(cur.ops)
			continue
		}
		if m := instLine.FindSubmatch(line); m != nil {
			op := string(m[1])
			if op == "NOP" {
				continue
			}
			if b := branch.FindSubmatch(line); b != nil {
				if at, ok := cur.labels[string(b[1])]; ok { // a branch back: a loop
					n, _ := strconv.Atoi(string(b[1]))
					cur.loops = append(cur.loops, [3]int{at, len(cur.ops), n})
				}
			}
			cur.ops = append(cur.ops, op)
			cur.counts[op]++
			cur.total++
		}
	}
	sort.Slice(fs, func(i, j int) bool { return fs[i].name < fs[j].name })
	return fs
}

func (f *function) print(w *os.File, top int) {
	type kv struct {
		op string
		n  int
	}
	var ops []kv
	for op, n := range f.counts {
		ops = append(ops, kv{op, n})
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i].n > ops[j].n || ops[i].n == ops[j].n && ops[i].op < ops[j].op })
	if len(ops) > top {
		ops = ops[:top]
	}
	var b strings.Builder
	for _, o := range ops {
		fmt.Fprintf(&b, " %s %d", o.op, o.n)
	}
	fmt.Fprintf(w, "%-28s %6d:%s\n", f.name, f.total, b.String())
	if !loops {
		return
	}
	for _, l := range f.loops {
		body := map[string]int{}
		for _, op := range f.ops[l[0] : l[1]+1] {
			body[op]++
		}
		fmt.Fprintf(w, "  loop .L_x_%d: %d instructions, HMMA %d, LDSM %d, LDGSTS %d, MUFU %d, BAR %d, LDL %d, STL %d\n", l[2],
			l[1]+1-l[0], body["HMMA"], body["LDSM"], body["LDGSTS"], body["MUFU"], body["BAR"], body["LDL"], body["STL"])
	}
}
