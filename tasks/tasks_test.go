package tasks

import (
	"math/rand/v2"
	"strings"
	"testing"
)

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
				for _, st := range Styles {
					sol := task.Solve(p, st)
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
	f.Fuzz(func(t *testing.T, response string) {
		for _, name := range Names() {
			for _, ans := range []string{"104|3,7,25,50", "42", "-3"} {
				if s := Score(name, ans, response); s != 0 && s != 1 {
					t.Fatalf("score %v", s)
				}
			}
		}
	})
}
