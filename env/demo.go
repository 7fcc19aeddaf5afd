package env

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/tasks"
	"github.com/keel-rl/keel/tokenizer"
)

// Teacher writes the model's turns of a demonstration (a cold start's
// reference trajectories): given the row, its own earlier turns and the
// environment's replies to each, the next turn's text (without its stop
// token).
type Teacher func(row *data.Example, turns []string, replies [][]tokenizer.Message) string

// Demonstrate plays one episode of e on row with teacher's turns, at most
// maxTurns of them, and returns the trajectory as supervised data stores
// a response: the turns, each but the last followed by <|im_end|> and the
// environment's answer as RenderObservation renders it (the last turn
// without its stop token, which training appends), with the episode's
// outcome. SplitTrajectory cuts it back into model text and observations.
func Demonstrate(ctx context.Context, e Environment, row *data.Example, teacher Teacher, maxTurns int) (string, Outcome, error) {
	ep, err := e.Start(ctx, row)
	if err != nil {
		return "", Outcome{}, err
	}
	defer ep.Close()
	var b strings.Builder
	var turns []string
	var replies [][]tokenizer.Message
	var out Outcome
	for k := 0; k < maxTurns; k++ {
		text := teacher(row, turns, replies)
		turns = append(turns, text)
		b.WriteString(text)
		reply, err := ep.Step(ctx, Turn{Text: text, Index: k, Last: k+1 == maxTurns})
		if err != nil {
			return "", Outcome{}, err
		}
		if out.take(reply) {
			return b.String(), out, nil
		}
		replies = append(replies, reply.Messages)
		b.WriteString(tokenizer.ImEnd)
		b.WriteString(RenderObservation(reply.Messages))
	}
	out.Cut = CutTurns
	return b.String(), out, nil
}

// Segment is a piece of a trajectory's text: the model's, or an
// observation (Obs).
type Segment struct {
	Text string
	Obs  bool
}

// SplitTrajectory cuts a trajectory written by Demonstrate (or by hand in
// its layout) into the model's text and the observations: an observation
// runs from the line break after a turn's <|im_end|> through the next
// "<|im_start|>assistant\n". Text with no observation is one model
// segment.
func SplitTrajectory(text string) []Segment {
	gen := tokenizer.ImStart + "assistant\n"
	var out []Segment
	for {
		i := strings.Index(text, tokenizer.ImEnd+"\n"+tokenizer.ImStart)
		if i < 0 {
			break
		}
		i += len(tokenizer.ImEnd)
		j := strings.Index(text[i:], gen)
		if j < 0 {
			break
		}
		j += i + len(gen)
		out = append(out, Segment{Text: text[:i]}, Segment{Text: text[i:j], Obs: true})
		text = text[j:]
	}
	if text != "" || len(out) == 0 {
		out = append(out, Segment{Text: text})
	}
	return out
}

// CalculatorHint is what a tool-style arithmetic prompt says after the
// problem, so that a tiny model without the tools' schemas in its prompt
// knows the calculator is there.
const CalculatorHint = " Tool: calculator."

// CalculatorTeacher demonstrates the calculator on arithmetic rows: with
// probability useTool it calls the calculator on the prompt's expression
// and answers with the result ("Answer: N"); otherwise it solves the
// problem in its head as the task's reference solutions do, in a style
// drawn from tasks.Styles. A teacher that does not always use the tool
// leaves RL something to learn.
func CalculatorTeacher(r *rand.Rand, useTool float64) Teacher {
	return func(row *data.Example, turns []string, replies [][]tokenizer.Message) string {
		prompt := strings.TrimSuffix(row.Prompt, CalculatorHint)
		if len(turns) == 0 {
			if r.Float64() < useTool {
				expr := strings.TrimSuffix(strings.TrimPrefix(prompt, "Compute "), ".")
				return fmt.Sprintf("<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"%s\"}}\n</tool_call>", expr)
			}
			p, err := tasks.Parse("arithmetic", prompt, row.Answer)
			if err != nil {
				return "Answer: ?"
			}
			t, _ := tasks.Get("arithmetic")
			return t.Solve(p, tasks.Styles[r.IntN(len(tasks.Styles))])
		}
		last := replies[len(replies)-1]
		if len(last) == 0 {
			return "Answer: ?"
		}
		return "Answer: " + last[0].Content
	}
}

// GuessTeacher plays the guessing game: at each turn it bisects the range
// the answers so far leave with probability bisect, and otherwise guesses
// uniformly within it (an imperfect player, which RL can improve on).
func GuessTeacher(r *rand.Rand, bisect float64) Teacher {
	return func(row *data.Example, turns []string, replies [][]tokenizer.Message) string {
		lo, hi := 1, 100
		if n, ok := tasks.ParseGuessRange(row.Prompt); ok {
			hi = n
		}
		for k, t := range turns {
			g, ok := tasks.LastGuess(t)
			if !ok || len(replies[k]) == 0 {
				continue
			}
			switch replies[k][0].Content {
			case "higher":
				lo = max(lo, g+1)
			case "lower":
				hi = min(hi, g-1)
			}
		}
		if hi < lo {
			lo, hi = hi, lo
		}
		g := (lo + hi) / 2
		if r.Float64() >= bisect {
			g = lo + r.IntN(hi-lo+1)
		}
		return fmt.Sprintf("Guess: %d", g)
	}
}

// CompactSystemPrompt is a one-line system prompt naming an environment's
// tools ("Tools: calculator."), for tiny models that cannot afford
// Qwen3's tools block (recipe env.system_prompt: compact); "" for an
// environment without tools.
func CompactSystemPrompt(e Environment) string {
	t, ok := e.(*ToolsEnv)
	if !ok || len(t.Specs()) == 0 {
		return ""
	}
	var names []string
	for _, s := range t.Specs() {
		names = append(names, s.Name)
	}
	return "Tools: " + strings.Join(names, ", ") + "."
}

// DemoSpec describes a generated set of episodes for the built-in
// environments (keel data gen --style tool): arithmetic problems for the
// calculator (environment tools) and guessing games (environment guess).
type DemoSpec struct {
	Tasks        []string // "arithmetic" and/or "guess", drawn in turn
	N            int
	Difficulties []int
	Seed         uint64
	// Demos adds each row's demonstration as its response (a cold start's
	// data); without, the rows are prompts and answers (held-out sets).
	Demos bool
	// UseTool is CalculatorTeacher's probability of calling the tool,
	// Bisect GuessTeacher's of bisecting; MaxTurns bounds an episode.
	UseTool, Bisect float64
	MaxTurns        int
}

// GenerateDemos draws the rows of s: row i from its own random stream
// (seed, i), so the same spec gives the same rows and a larger N extends a
// smaller one. Arithmetic rows with demonstrations carry the compact
// system prompt of the tools environment as a system message, as the RL
// recipe's env.system_prompt: compact puts it before the plain rows; a
// demonstration that fails (a game not won within MaxTurns) is drawn again
// from the row's stream, up to 16 times, and the row is dropped after
// that.
func GenerateDemos(ctx context.Context, s DemoSpec) ([]data.Example, error) {
	if s.N < 1 || len(s.Tasks) == 0 || len(s.Difficulties) == 0 {
		return nil, fmt.Errorf("env: demonstrations need n >= 1, tasks and difficulties")
	}
	if s.Demos && s.MaxTurns < 1 {
		return nil, fmt.Errorf("env: demonstrations need max turns >= 1")
	}
	arith, err := tasks.Get("arithmetic")
	if err != nil {
		return nil, err
	}
	tools := NewTools(Calculator())
	envs := map[string]Environment{"arithmetic": tools, "guess": Guess()}
	for _, t := range s.Tasks {
		if envs[t] == nil {
			return nil, fmt.Errorf("env: no built-in environment plays task %q (tool-style tasks: arithmetic, guess)", t)
		}
	}
	out := make([]data.Example, 0, s.N)
	for i := range s.N {
		r := rand.New(rand.NewPCG(s.Seed, uint64(i)))
		task := s.Tasks[i%len(s.Tasks)]
		d := s.Difficulties[r.IntN(len(s.Difficulties))]
		var p tasks.Problem
		if task == "guess" {
			p = tasks.GenerateGuess(r, d)
		} else {
			p = arith.Generate(r, d)
		}
		row := data.Example{Task: p.Task, Difficulty: p.Difficulty, Prompt: p.Prompt, Answer: p.Answer}
		if !s.Demos {
			out = append(out, row)
			continue
		}
		teacher := GuessTeacher(r, s.Bisect)
		if task == "arithmetic" {
			teacher = CalculatorTeacher(r, s.UseTool)
			row.Messages = []tokenizer.Message{{Role: "system", Content: CompactSystemPrompt(tools)}, {Role: "user", Content: p.Prompt}}
		}
		for try := 0; try < 16; try++ {
			text, oc, err := Demonstrate(ctx, envs[task], &row, teacher, s.MaxTurns)
			if err != nil {
				return nil, fmt.Errorf("env: row %d: %w", i, err)
			}
			if oc.Done && oc.Correct == 1 {
				row.Response, row.Style = text, "tool"
				out = append(out, row)
				break
			}
		}
	}
	return out, nil
}
