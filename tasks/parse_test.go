package tasks

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// A generated problem parses back from its prompt and answer: the same
// solutions for arithmetic and linear; for Countdown a solution as short
// as the generated one that verifies.
func TestParseGenerated(t *testing.T) {
	for _, name := range Names() {
		task, _ := Get(name)
		r := rand.New(rand.NewPCG(11, 12))
		for d := 1; d <= MaxDifficulty; d++ {
			for i := 0; i < 60; i++ {
				p := task.Generate(r, d)
				q, err := Parse(name, p.Prompt, p.Answer)
				if err != nil {
					t.Fatalf("%s %q %q: %v", name, p.Prompt, p.Answer, err)
				}
				// A problem read from a file (no solution data) is solved
				// through Parse too.
				bare := Problem{Task: p.Task, Prompt: p.Prompt, Answer: p.Answer}
				for _, st := range Styles {
					sol, sq, sb := task.Solve(p, st), task.Solve(q, st), task.Solve(bare, st)
					if sq != sb || q.Score(sq) != 1 {
						t.Fatalf("%s %q style %s: parsed solution %q (bare %q)", name, p.Prompt, st, sq, sb)
					}
					if name == "countdown" {
						if strings.Count(sq, "\n") > strings.Count(sol, "\n") {
							t.Fatalf("%s: a longer solution than the generated one:\n%s\n%s", p.Prompt, sq, sol)
						}
					} else if sq != sol {
						t.Fatalf("%s %q style %s: %q, generated %q", name, p.Prompt, st, sq, sol)
					}
				}
			}
		}
	}
}

func TestParseHandChecked(t *testing.T) {
	for _, c := range []struct {
		task, prompt, answer, chain string // chain: the parsed problem's chain solution
	}{
		{"arithmetic", "Compute 12*34.", "408", "12*34 = 12*30+12*4 = 360+48 = 408\nAnswer: 408"},
		{"arithmetic", " Compute 100-1", "99", "100-1 = 99\nAnswer: 99"},
		{"linear", "Solve 3x+1=x-5.", "-3", "3x+1=x-5 -> 2x+1=-5 -> 2x=-6 -> x=-3\nAnswer: -3"},
		{"linear", "Solve 7 + 2x = 3x.", "7", "2x+7=3x -> -x+7=0 -> -x=-7 -> x=7\nAnswer: 7"},
		{"linear", "Solve -x=4.", "-4", "-x=4 -> x=-4\nAnswer: -4"},
		{"countdown", "anything", "24|3,8,1", "3*8=24\nAnswer: 3*8"},
		{"countdown", "", "3|3,5", "\nAnswer: 3"},
		{"countdown", "", "952|25,50,75,100,3,6", "100+6=106, 75*3=225, 106*225=23850, 23850-50=23800, 23800/25=952\nAnswer: (((100+6)*(75*3))-50)/25"},
		{"countdown", "", "2|7,5,3", "7-5=2\nAnswer: 7-5"},
		{"countdown", "", "1|6,4,2", "6-4=2, 2/2=1\nAnswer: (6-4)/2"},
	} {
		p, err := Parse(c.task, c.prompt, c.answer)
		if err != nil {
			t.Errorf("%s %q %q: %v", c.task, c.prompt, c.answer, err)
			continue
		}
		task, _ := Get(c.task)
		if got := task.Solve(p, Chain); got != c.chain {
			t.Errorf("%s %q %q: chain\n got %q\nwant %q", c.task, c.prompt, c.answer, got, c.chain)
		}
		if p.Score(task.Solve(p, Scratch)) != 1 || p.Score(task.Solve(p, Terse)) != 1 {
			t.Errorf("%s %q: solutions do not verify", c.task, c.answer)
		}
	}
	for _, c := range []struct{ task, prompt, answer, want string }{
		{"arithmetic", "Compute 12*34.", "407", "the prompt's answer is 408"},
		{"arithmetic", "Add 1 and 2.", "3", `want "Compute A+B."`},
		{"arithmetic", "Compute -1+2.", "1", "want \"Compute A+B.\""},
		{"arithmetic", "Compute 1/2.", "0", "want \"Compute A+B.\""},
		{"arithmetic", "Compute 99999999999*2.", "1", "below 10^9"},
		{"linear", "Solve x=x.", "0", "no unique integer solution"},
		{"linear", "Solve 2x=3.", "1", "no unique integer solution"},
		{"linear", "Solve 2x=4.", "3", "the prompt's answer is 2"},
		{"linear", "Solve 2y=4.", "2", "want + or -"},
		{"linear", "Solve 2x=.", "2", "an empty side"},
		{"linear", "Solve 2x=4+.", "2", "want a term"},
		{"linear", "Solve 2x.", "2", "no '='"},
		{"linear", "Solve 1234567x=1.", "2", "too large"},
		{"countdown", "", "7|2,2", "no solution"},
		{"countdown", "", "7", "want \"TARGET|n1,n2,...\""},
		{"countdown", "", "7|2,0", "numbers must be integers"},
		{"countdown", "", "7|1,2,3,4,5,6,7", "at most 6 numbers"},
		{"chess", "", "1", "unknown task"},
	} {
		if _, err := Parse(c.task, c.prompt, c.answer); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %q %q: err = %v, want %q", c.task, c.prompt, c.answer, err, c.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add("linear", "Solve 3x+1=x-5.", "-3")
	f.Add("arithmetic", "Compute 12*34.", "408")
	f.Add("countdown", "", "24|3,8,1")
	f.Fuzz(func(t *testing.T, task, prompt, answer string) {
		if strings.Count(answer, ",") > 4 {
			return // keep the Countdown search small
		}
		p, err := Parse(task, prompt, answer)
		if err != nil {
			return
		}
		tk, _ := Get(task)
		for _, st := range Styles {
			if sol := tk.Solve(p, st); p.Score(sol) != 1 {
				t.Fatalf("%s %q %q: solution %q scores 0", task, prompt, answer, sol)
			}
		}
	})
}

// What Countdown's documentation promises of each level.
func TestCountdownLevels(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for d := 1; d <= MaxDifficulty; d++ {
		for i := 0; i < 100; i++ {
			p := Countdown{}.Generate(r, d)
			cd := p.solve.(cdProblem)
			large := false
			for _, n := range cd.nums {
				large = large || n == 50 || n == 75 || n == 100 || n == 25
				if n == cd.target || n < 1 || (n > []int64{10, 25, 25, 100, 100}[d-1]) {
					t.Fatalf("d=%d %q: number %d", d, p.Prompt, n)
				}
			}
			if len(cd.nums) != []int{3, 3, 4, 4, 5}[d-1] || len(cd.steps) != []int{1, 2, 2, 3, 3}[d-1] ||
				cd.target < 2 || cd.target > 999 || (d >= 4 && !large) {
				t.Fatalf("d=%d %q: %d numbers, %d steps", d, p.Prompt, len(cd.nums), len(cd.steps))
			}
		}
	}
}
