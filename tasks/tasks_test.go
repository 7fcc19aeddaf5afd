package tasks

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// Generation is pinned: data sets, recipes and the README's figures are
// reproduced from seeds, so a change to what a seed draws must be
// deliberate. Every solution here was checked by hand.
func TestGenerationPinned(t *testing.T) {
	want := map[string][]string{
		"arithmetic": {
			"Compute 9+65.", "74", "add 60: 9+60 = 69\nadd 5: 69+5 = 74\nAnswer: 74", "9+65 = 69+5 = 74\nAnswer: 74",
			"Compute 5826-5696.", "130", "subtract 5000: 5826-5000 = 826\nsubtract 600: 826-600 = 226\nsubtract 90: 226-90 = 136\nsubtract 6: 136-6 = 130\nAnswer: 130", "5826-5696 = 826-696 = 226-96 = 136-6 = 130\nAnswer: 130",
			"Compute 448*59.", "26432", "448*50 = 22400\n448*9 = 4032\nadd them: 22400+4032 = 26432\nAnswer: 26432", "448*59 = 448*50+448*9 = 22400+4032 = 26432\nAnswer: 26432",
		},
		"countdown": {
			"Use 9 10 5 to make 14.", "14|9,10,5", "9+5 = 14\nAnswer: 9+5", "9+5=14\nAnswer: 9+5",
			"Use 22 8 16 10 to make 2.", "2|22,8,16,10", "8+16 = 24\n24-22 = 2\nAnswer: (8+16)-22", "8+16=24, 24-22=2\nAnswer: (8+16)-22",
			"Use 19 13 50 14 4 to make 66.", "66|19,13,50,14,4", "14*19 = 266\n4*50 = 200\n266-200 = 66\nAnswer: (14*19)-(4*50)", "14*19=266, 4*50=200, 266-200=66\nAnswer: (14*19)-(4*50)",
		},
		"linear": {
			"Solve x+18=37.", "19", "move the constant right: 37-18=19, so x=19\nAnswer: 19", "x+18=37 -> x=19\nAnswer: 19",
			"Solve -x+5=-6.", "11", "move the constant right: -6-5=-11, so -x=-11\ndivide by -1: -11/-1=11, so x=11\nAnswer: 11", "-x+5=-6 -> -x=-11 -> x=11\nAnswer: 11",
			"Solve 8x+4=7x-21.", "-25", "move the x terms left: 8x-7x=x, so x+4=-21\nmove the constant right: -21-4=-25, so x=-25\nAnswer: -25", "8x+4=7x-21 -> x+4=-21 -> x=-25\nAnswer: -25",
		},
	}
	for name, w := range want {
		task, err := Get(name)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(3, 4))
		for i, d := range []int{1, 3, 5} {
			p := task.Generate(r, d)
			got := []string{p.Prompt, p.Answer, task.Solve(p, Scratch), task.Solve(p, Chain)}
			for k := range got {
				if got[k] != w[4*i+k] {
					t.Errorf("%s d=%d field %d:\n got %q\nwant %q", name, d, k, got[k], w[4*i+k])
				}
			}
			if p.Task != name || p.Difficulty != d {
				t.Errorf("%s: Task %q Difficulty %d", name, p.Task, p.Difficulty)
			}
			if got := task.Solve(p, Terse); got != "Answer: "+strings.TrimPrefix(w[4*i+3][strings.LastIndex(w[4*i+3], "Answer: "):], "Answer: ") {
				t.Errorf("%s terse: %q", name, got)
			}
		}
	}
}

// Every family's reference solutions, in every style and at every
// difficulty, score 1; a wrong or unmarked answer scores 0.
func TestSolutionsVerify(t *testing.T) {
	for _, name := range Names() {
		task, _ := Get(name)
		r := rand.New(rand.NewPCG(1, 2))
		for d := 1; d <= MaxDifficulty; d++ {
			for i := 0; i < 200; i++ {
				p, err := Generate(task, r, d)
				if err != nil {
					t.Fatal(err)
				}
				if !printable(p.Prompt) || !printable(p.Answer) {
					t.Fatalf("%s: not printable ASCII: %q %q", name, p.Prompt, p.Answer)
				}
				for _, st := range Styles {
					sol := task.Solve(p, st)
					if !printable(sol) || !strings.HasPrefix(sol[strings.LastIndexByte(sol, '\n')+1:], "Answer: ") {
						t.Fatalf("%s %s: not printable ASCII lines ending with the answer line: %q", name, st, sol)
					}
					if task.Score(p.Answer, sol) != 1 {
						t.Fatalf("%s d=%d %q style %s: own solution scores 0:\n%s", name, d, p.Prompt, st, sol)
					}
					if len(p.Prompt)+len(sol) > 300 {
						t.Fatalf("%s d=%d: %d characters, too long for the tiny models:\n%s\n%s", name, d, len(p.Prompt)+len(sol), p.Prompt, sol)
					}
				}
				if task.Score(p.Answer, strings.ReplaceAll(task.Solve(p, Scratch), "Answer:", "Result:")) != 0 {
					t.Fatalf("%s: an unmarked answer scored 1", name)
				}
			}
		}
	}
}

// printable reports whether s is printable ASCII and newlines only.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c != '\n' && (c < ' ' || c > '~') {
			return false
		}
	}
	return true
}

// Difficulty levels scale the problems: the mean problem (prompt and
// answer) grows with the level, and a level out of range neither panics nor escapes [1, 5].
func TestDifficultyScales(t *testing.T) {
	for _, name := range Names() {
		task, _ := Get(name)
		prev := 0.0
		for d := 1; d <= MaxDifficulty; d++ {
			r := rand.New(rand.NewPCG(9, uint64(d)))
			n := 0
			for i := 0; i < 300; i++ {
				p := task.Generate(r, d)
				n += len(p.Prompt) + len(p.Answer)
			}
			mean := float64(n) / 300
			if mean < prev {
				t.Errorf("%s: difficulty %d mean length %.1f < level %d's %.1f", name, d, mean, d-1, prev)
			}
			prev = mean
		}
		for _, d := range []int{-3, 0, 6, 1 << 30} {
			p := task.Generate(rand.New(rand.NewPCG(1, 1)), d)
			if p.Difficulty < 1 || p.Difficulty > MaxDifficulty || p.Score(task.Solve(p, Chain)) != 1 {
				t.Errorf("%s difficulty %d: got level %d, %q", name, d, p.Difficulty, p.Prompt)
			}
		}
		if s := task.Solve(Problem{Task: name, Prompt: "x", Answer: "1"}, Scratch); s != "" {
			t.Errorf("%s: Solve of a problem without solution data = %q", name, s)
		}
	}
}

func TestGenerateDeterministic(t *testing.T) {
	for _, name := range Names() {
		task, _ := Get(name)
		a := task.Generate(rand.New(rand.NewPCG(5, 6)), 3)
		b := task.Generate(rand.New(rand.NewPCG(5, 6)), 3)
		if a.Prompt != b.Prompt || a.Answer != b.Answer {
			t.Fatalf("%s: same seed, different problems", name)
		}
	}
	if _, err := Generate(Arithmetic{}, rand.New(rand.NewPCG(1, 1)), 6); err == nil {
		t.Fatal("difficulty 6 accepted")
	}
}

func TestHandChecked(t *testing.T) {
	cases := []struct {
		task, answer, response string
		want                   float64
	}{
		{"arithmetic", "5218", "4821+397 = 5218\nAnswer: 5218", 1},
		{"arithmetic", "5218", "Answer: 5,218.", 1},
		{"arithmetic", "5218", `so \boxed{5218}`, 1},
		{"arithmetic", "5218", "Answer: 5218\nwait, Answer: 5217", 0}, // the last answer wins
		{"arithmetic", "5218", "Answer: 5217\n\\boxed{5218}", 1},      // boxed after the line
		{"arithmetic", "-42", "Answer: - 42", 1},
		{"arithmetic", "5218", "5218", 0}, // unmarked
		{"arithmetic", "5218", "Answer: 5218x", 0},
		{"arithmetic", "5218", `\boxed{5218`, 0}, // unclosed
		{"linear", "-3", "Answer: x=-3", 1},
		{"linear", "-3", "Answer: 3", 0},
		{"countdown", "104|3,7,25,50", "Answer: (25-7)*3+50", 1},
		{"countdown", "104|3,7,25,50", "Answer: 50+3*(25-7) = 104", 1},
		{"countdown", "104|3,7,25,50", "Answer: 50+50+3+1", 0}, // 50 twice, 1 not given
		{"countdown", "104|3,7,25,50", "Answer: 104", 0},       // not a given number
		{"countdown", "2|4,2,1", "Answer: 4/2", 1},
		{"countdown", "2|4,2,1", "Answer: 4/(2-2)", 0}, // division by zero
		{"countdown", "3|9,3", "Answer: 9/3/1", 0},     // 1 not given
		{"countdown", "5|2,3", "Answer: ((2+3)", 0},
		{"countdown", "5|2,3", "Answer: 2+3)", 0},
		{"nosuchtask", "1", "Answer: 1", 0},
		// Markers: case, R1-style tags, the last marker wins.
		{"arithmetic", "7", "final answer: 7", 1},
		{"arithmetic", "7", "ANSWER: 7\n", 1},
		{"arithmetic", "7", "<answer>7</answer>", 1},
		{"arithmetic", "7", "<answer> 7 </answer> Answer: 8", 0},
		{"arithmetic", "7", "Answer: 8 <answer>7</answer>", 1},
		{"arithmetic", "7", "<answer>Answer: 7</answer>", 1},
		{"arithmetic", "7", "<answer>7", 0},
		{"arithmetic", "7", `\boxed{7} then \boxed{8`, 1}, // an unclosed box is skipped
		{"arithmetic", "7", `Answer: \boxed{7}.`, 1},
		{"arithmetic", "7", `\boxed{{7}}`, 0},
		{"arithmetic", "7", "Answer:\n7", 0}, // the answer is on the marked line
		{"arithmetic", "7", "Answer: 7 apples", 0},
		{"arithmetic", "7", "Answer: +7", 1},
		{"arithmetic", "7", "Answer: 07", 1},
		// Thousands commas only in groups of three.
		{"arithmetic", "1234567", "Answer: 1,234,567", 1},
		{"arithmetic", "1234567", "Answer: 12,34,567", 0},
		{"arithmetic", "1234567", "Answer: 1234,567", 0},
		{"arithmetic", "1234", "Answer: 1234,", 0},
		{"arithmetic", "1234", "Answer: ,1234", 0},
		{"arithmetic", "123456789012345678", "Answer: 123456789012345678", 1},
		{"arithmetic", "1", "Answer: 1234567890123456789", 0}, // too long
		{"arithmetic", "not a number", "Answer: 5", 0},        // a bad ground truth scores 0
		{"linear", "-3", "Answer: x = -3", 1},
		{"linear", "-3", "Answer: y=-3", 0},
		// Countdown: a stated result must be the target; spaces and tabs
		// are ignored; integers only, no unary minus.
		{"countdown", "104|3,7,25,50", "Answer: (25-7)*3+50 = 105", 0},
		{"countdown", "104|3,7,25,50", "Answer: (25-7)*3+50 = 104 = 104", 0},
		{"countdown", "104|3,7,25,50", "Answer: ( 25 -\t7 ) * 3 + 50", 1},
		{"countdown", "104|3,7,25,50", "Answer: 3*(50/25+7)*3+50", 0}, // 3 twice
		{"countdown", "2|3,7,25,50", "Answer: 50/25", 1},
		{"countdown", "1|3,7,25,50", "Answer: (3+7)/(25-50+35)", 0}, // 35 not given
		{"countdown", "-1|3,4", "Answer: 3-4", 1},
		{"countdown", "1|3,4", "Answer: -3+4", 0},
		{"countdown", "3|6,4,2", "Answer: 6/(4/2)", 1},
		{"countdown", "3|6,4,2", "Answer: 6/4*2", 1},
		{"countdown", "3|6,4,2", "Answer: 6/4/2", 0},      // 3/4
		{"countdown", "1|3,4,7", "Answer: (7-4)/3", 1},    // exact rationals
		{"countdown", "1|3,4,7", "Answer: 7/3-4/3", 0},    // 3 twice
		{"countdown", "2|3,4,7", "Answer: 3.5+4", 0},      // no decimals
		{"countdown", "104", "Answer: 104", 0},            // bad ground truth
		{"countdown", "104|3,x", "Answer: 3", 0},          // bad ground truth
		{"countdown", "104|3,7,25,50", "Answer: ()", 0},   // empty parentheses
		{"countdown", "104|3,7,25,50", "Answer: 3 7", 0},  // no operator: 37 is not given
		{"countdown", "104|3,7,25,50", "Answer: 3++7", 0}, // no unary plus
	}
	for _, c := range cases {
		if got := Score(c.task, c.answer, c.response); got != c.want {
			t.Errorf("%s %q on %q = %v, want %v", c.task, c.answer, c.response, got, c.want)
		}
	}
}

func FuzzScore(f *testing.F) {
	f.Add("Answer: (25-7)*3+50")
	f.Add(`\boxed{\boxed{((((1`)
	f.Add("Answer: 99999999999999999999")
	f.Add("<answer>3*(4+5)</answer>")
	f.Add("Answer: 1,234 = 5\n\\boxed{x=-3}")
	right := map[string][2]string{ // ground truth, a right final answer
		"arithmetic": {"42", "42"},
		"linear":     {"-3", "x=-3"},
		"countdown":  {"104|3,7,25,50", "(25-7)*3+50"},
	}
	f.Fuzz(func(t *testing.T, response string) {
		for _, name := range Names() {
			for _, ans := range []string{"104|3,7,25,50", "42", "-3"} {
				if s := Score(name, ans, response); s != 0 && s != 1 {
					t.Fatalf("score %v", s)
				}
			}
			// Whatever came before, a right answer on the last line wins.
			r := right[name]
			if s := Score(name, r[0], response+"\nAnswer: "+r[1]); s != 1 {
				t.Fatalf("%s: %q then a right answer line scores %v", name, response, s)
			}
		}
	})
}
