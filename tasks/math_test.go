package tasks

import (
	"math/big"
	"strings"
	"testing"
	"time"
)

// Every row was decided by hand: the ground truth, a response, and the
// verdict a mathematician grading the response would give.
func TestMathScore(t *testing.T) {
	cases := []struct {
		truth, response string
		want            float64
	}{
		// Answer markers: the last \boxed{}, \fbox{}, "####", "the answer
		// is", "Answer:", <answer>.
		{"5", `so \boxed{5}`, 1},
		{"5", `so \fbox{5}.`, 1},
		{"5", "work...\n#### 5", 1},
		{"5", "The answer is 5.", 1},
		{"5", "Final answer: 5", 1},
		{"5", "**Final Answer:** $5$", 1},
		{"5", "<think>2+3</think><answer>5</answer>", 1},
		{"5", "The final answer is $5$. I hope it is correct.", 1},
		{"5", `Thus \boxed{5}. I hope this answer is correct.`, 1},
		{"5", "Answer: The sum of the roots is 5.", 1},
		{"5", `\boxed 5`, 1},
		{"5", "5", 0},               // no marker
		{"5", `\boxed{5`, 0},        // unclosed
		{"5", `\boxed{}`, 0},        // empty
		{"5", "The answer is 6", 0}, // wrong
		// Numbers: thousands separators, decimal points, signs.
		{"12345", `\boxed{12,345}`, 1},
		{"12345", `\boxed{12{,}345}`, 1},
		{"12345", `\boxed{12\,345}`, 1},
		{"12345", `\boxed{12,\!345}`, 1},
		{"1000000", `\boxed{1 000 000}`, 1},
		{"1000.5", `\boxed{1,000.50}`, 1},
		{"0.5", `\boxed{.5}`, 1},
		{"-3", `\boxed{-3}`, 1},
		{"-3", `\boxed{- 3}`, 1},
		{"3", `\boxed{3.0}`, 1},
		{"1,234", `\boxed{1234}`, 1},
		{"3.5", `\boxed{3,5}`, 1}, // a decimal comma against one number
		{"1000.99", `\boxed{1000,99}`, 1},
		{"3,5", `\boxed{3.5}`, 1},    // the same, the other way
		{"3, 5", `\boxed{3,5}`, 1},   // a list of two
		{"3.5", `\boxed{3, 5}`, 0},   // a list with a space is no decimal
		{"35", `\boxed{3,5}`, 0},     // not a thousands grouping
		{"1100", `\boxed{1,100}`, 1}, // a thousands grouping
		{"12", `\boxed{1,2}`, 0},
		{"10", `\boxed{010}`, 1},
		{"100", `\boxed{10}`, 0},
		{"100000000000000000000", `\boxed{100000000000000000001}`, 0}, // integers exactly
		// Units and currency.
		{"18", `\boxed{\$18}`, 1},
		{"18", `\boxed{18 \text{ dollars}}`, 1},
		{"18", "The answer is $18.", 1},
		{"18", `\boxed{18\text{ cm}^2}`, 1},
		{"15", `\boxed{15\mbox{ cm}^2}`, 1},
		{"125", `\boxed{125\textnormal{ miles}}`, 1},
		{"125", `\boxed{125 miles}`, 1},
		{"5", `\boxed{5cm}`, 1},
		{"90", `\boxed{90^\circ}`, 1},
		{"90^\\circ", `\boxed{90}`, 1},
		{"90", `\boxed{90^{\circ}}`, 1},
		{"90", `\boxed{90°}`, 1},
		{"30", `\boxed{30 \text{ degrees}}`, 1},
		{"0.06", `\boxed{0.06 \text{ yuan}}`, 1},
		{"3", `\boxed{3ab}`, 0}, // a product, not 3 with a unit
		{"3", `\boxed{3 x}`, 0},
		{"2", `\boxed{2\pi}`, 0},
		// Percentages: 28% is 28 and 0.28.
		{`28\%`, `\boxed{28\%}`, 1},
		{`28\%`, `\boxed{28}`, 1},
		{`28\%`, `\boxed{0.28}`, 1},
		{"28", `\boxed{28 percent}`, 1},
		{"0.28", `\boxed{28\%}`, 1},
		{`28\%`, `\boxed{0.28\%}`, 0},
		{`28\%`, `\boxed{2.8}`, 0},
		// A percent answer has one reading, chosen by the truth: /100
		// against a proportion (|truth| <= 1), literal against more.
		{"0.5", `\boxed{0.5\%}`, 0},
		{"0.5", `\boxed{50\%}`, 1},
		{"1", `\boxed{1\%}`, 0},
		{"1", `\boxed{100\%}`, 1},
		{"50", `\boxed{5000\%}`, 0},
		{"50", `\boxed{50\%}`, 1},
		{"0.28", `\boxed{28\%}`, 1},
		{"28", `\boxed{28\%}`, 1},
		{"28", `\boxed{0.28}`, 0},
		// Huge factorials and binomials are undefined, never wrapped.
		{"6", `\boxed{18446744073709551619!}`, 0},
		{"6", `\boxed{(2^{64}+3)!}`, 0},
		{"1", `\boxed{(2^{64})!}`, 0},
		{"1", `\boxed{(170!)!}`, 0},
		{"1", `\boxed{(21!)!}`, 0},
		{"10", `\boxed{\binom{2^{64}+5}{2}}`, 0},
		{"10", `\boxed{\binom{5}{-1}}`, 0},
		{"6", `\boxed{3!}`, 1},
		{"10", `\boxed{\binom{5}{2}}`, 1},
		{"120", `\boxed{(3!-1)!}`, 1},
		// Values past float64 stay exact, or are undefined: never +Inf.
		{"2^{2019}", `\boxed{2^{2020}}`, 0},
		{"2^{2019}", `\boxed{5^{2020}}`, 0},
		{"2^{2019}", `\boxed{2^{2019}-1}`, 0},
		{"2^{2019}", `\boxed{2^{2019}}`, 1},
		{"2^{2019}", `\boxed{2\cdot 2^{2018}}`, 1},
		{"2^{700}", `\boxed{2^{700}+1}`, 0},
		{"10^{410}", `\boxed{10^{410}+1}`, 0},
		{"10^{410}", `\boxed{10^{410}}`, 1},
		{`\infty`, `\boxed{10^{400}}`, 0},
		{`\infty`, `\boxed{10^{10^{10}}}`, 0},
		{`\infty`, `\boxed{\infty}`, 1},
		{`(-\infty,3]`, `\boxed{(-10^{400},3]}`, 0},
		{`(-\infty,3]`, `\boxed{(-\infty,3]}`, 1},
		{"0", `\boxed{2^{-2000}}`, 0},
		{"10^{20}", `\boxed{10^{20}+10^{-1000}}`, 0},
		{"1", `\boxed{1^{10^{10}}}`, 1},
		// Two different exact values are different, however close.
		{"1000000000", `\boxed{1000000000+\frac13}`, 0},
		{"333333333333", `\boxed{\frac{10^{12}}{3}}`, 0},
		{`\frac{10^{12}+1}{3}`, `\boxed{\frac{10^{12}}{3}}`, 0},
		{`\frac23`, `\boxed{\frac{2000000001}{3000000000}}`, 0},
		{"3", `\boxed{3+\frac{1}{3\cdot10^{12}}}`, 0},
		{`\frac{1}{12}`, `\boxed{0.0833333333333333}`, 1}, // a rounded decimal
		{`\frac{10^{12}}{3}`, `\boxed{333333333333.3333}`, 1},
		// Hedges, scale and operation words are no units.
		{"3", `\boxed{3 \text{ or four}}`, 0},
		{"3", `\boxed{3\text{, or maybe four}}`, 0},
		{"3", `\boxed{3 \text{ (or four)}}`, 0},
		{"3", `\boxed{3 \text{ to five}}`, 0},
		{"3", `\boxed{3 \text{ plus four}}`, 0},
		{"3", `\boxed{3 \text{ or more}}`, 0},
		{"3", `\boxed{3 \text{ is wrong}}`, 0},
		{"3", `\boxed{3 \text{ (approximately)}}`, 0},
		{"3", `\boxed{3 \text{ thousand}}`, 0},
		{"3", `\boxed{3 \text{ hundred}}`, 0},
		{"3", `\boxed{3 \text{ million}}`, 0},
		{"3", `\boxed{3 \text{ dozen}}`, 0},
		{"3", `\boxed{3 \text{ squared}}`, 0},
		{"3", `\boxed{3 maybe}`, 0},
		{"odd", `\boxed{\text{odd} \text{ or even}}`, 0},
		{`\text{(C)}`, `\boxed{C \text{ or D}}`, 0},
		{"3", `\boxed{3 \text{ four}}`, 0},
		{"3", `\boxed{3 \text{ ways}}`, 1},
		{"3", `\boxed{3 \text{ cm}}`, 1},
		{"3", `\boxed{3 \text{ square units}}`, 1},
		{"3", `\boxed{3 \text{ m}}`, 1},
		{"3", `\boxed{3 \text{ apples}}`, 1},
		// A decimal comma with only zeros after it is a list.
		{"3", `\boxed{3,0}`, 0},
		{"5", `\boxed{5,00}`, 0},
		// Fractions, mixed numbers, roots, pi.
		{`\frac{1}{2}`, `\boxed{0.5}`, 1},
		{`\frac12`, `\boxed{\dfrac{1}{2}}`, 1},
		{`\frac{1}{2}`, `\boxed{\tfrac{1}{2}}`, 1},
		{`\frac{1}{2}`, `\boxed{\cfrac{2}{4}}`, 1},
		{`\frac{1}{2}`, `\boxed{1/2}`, 1},
		{"-10/9", `\boxed{-\frac{10}{9}}`, 1},
		{`\frac{1}{3}`, `\boxed{\frac13}`, 1},
		{`\frac{1}{3}`, `\boxed{0.333}`, 0}, // an approximation
		{`\frac{1}{3}`, `\boxed{0.3333333333333}`, 1},
		{`\frac{1}{12}`, `\boxed{0.0833333333333333}`, 1},
		{`2\frac{1}{2}`, `\boxed{2.5}`, 1},
		{`2\frac{1}{2}`, `\boxed{\frac{5}{2}}`, 1},
		{"5/2", `\boxed{2 1/2}`, 1},
		{"5/2", `\boxed{-2\frac12}`, 0},
		{`918\frac{1}{2}`, `\boxed{918.5}`, 1},
		{`\sqrt{2}`, `\boxed{\sqrt2}`, 1},
		{`2\sqrt{2}`, `\boxed{\sqrt{8}}`, 1},
		{`3\sqrt{13}`, `\boxed{\sqrt{117}}`, 1},
		{`\sqrt{2}`, `\boxed{1.41421356}`, 0},
		{`\sqrt{17}`, `\boxed{4.123105625617661}`, 1},
		{`\sqrt[3]{8}`, `\boxed{2}`, 1},
		{`\frac{\sqrt{3}}{3}`, `\boxed{\frac{1}{\sqrt{3}}}`, 1},
		{`4`, `\boxed{4\sqrt{2}}`, 0},
		{`2\pi`, `\boxed{6.283185307179586}`, 1},
		{`\frac{9}{4}\pi`, `\boxed{\frac94\pi}`, 1},
		{`\pi`, `\boxed{3.14}`, 0},
		{"2^{10}", `\boxed{1024}`, 1},
		{"1024", `\boxed{2^10}`, 1},
		{"6", `\boxed{3!}`, 1},
		{"10", `\boxed{\binom{5}{2}}`, 1},
		{"3", `\boxed{\left( 3 \right)}`, 1},
		{"3", `\boxed{|-3|}`, 1},
		{"2", `\boxed{\log_2 4}`, 1},
		// Expressions: equal at random points, exactly where rational.
		{"x^2+2x+1", `\boxed{(x+1)^2}`, 1},
		{"x^2+2x+1", `\boxed{(x+1)(x+1)}`, 1},
		{"x^2+2x+1", `\boxed{x^2 + 2\cdot x + 1}`, 1},
		{"x^2+2x+1", `\boxed{2x+ 1+x^2}`, 1},
		{"x^2+2x+1", `\boxed{x^3+2x+1}`, 0},
		{"x^2+2x+1", `\boxed{x^2+2x}`, 0},
		{`\frac{x+2}{7}`, `\boxed{\frac{x}{7}+\frac{2}{7}}`, 1},
		{`2 \sin b \cos a`, `\boxed{2\cos a \sin b}`, 1},
		{`\tan^2(y)+1`, `\boxed{\sec^2(y)}`, 1},
		{`\frac{\pi r}{h+r}`, `\boxed{\frac{r\pi}{r+h}}`, 1},
		{`|x|`, `\boxed{x}`, 0}, // differs for negative x
		{`\sqrt{x^2}`, `\boxed{|x|}`, 1},
		{"x+2n+1", `\boxed{x+1}`, 0},
		{"a+b", `\boxed{b+a}`, 1},
		{"x+1", `\boxed{y+1}`, 0},
		{"2x", `\boxed{2 \times x}`, 1},
		{"(r+5)^2", `\boxed{(r+5)(r+5)}`, 1},
		{`x^{2/3}`, `\boxed{\sqrt[3]{x^2}}`, 1},
		// An expression that agrees with the truth at a few points only.
		{"x", `\boxed{x + (x-1)(x-2)(x-3)(x+1)(x+2)(x+3)(x-4)(x+4)(x-1/2)}`, 0},
		// Tuples, intervals, sets, lists.
		{"(1,2)", `\boxed{(1, 2)}`, 1},
		{"(1,2)", `\boxed{(2, 1)}`, 0},
		{"(1,2]", `\boxed{(1,2]}`, 1},
		{"(1,2]", `\boxed{(1,2)}`, 0},
		{"[0,1)", `\boxed{[0,1)}`, 1},
		{"[0,1)", `\boxed{(0,1)}`, 0},
		{"[0,9)", `\boxed{[0,1)}`, 0},
		{`(-\infty, 3]`, `\boxed{(-\infty,3]}`, 1},
		{`(1, +\infty)`, `\boxed{\left(1, \infty\right)}`, 1},
		{`(3, \frac{\pi}{2})`, `\boxed{\left( 3, \frac{\pi}{2} \right)}`, 1},
		{`(1,\frac{9}{2})`, `\boxed{(1,4.5)}`, 1},
		{`[-1, -\frac{1}{2}) \cup (-\frac{1}{2}, 0)`, `\boxed{[-1, -\tfrac12) \cup (-\tfrac12, 0)}`, 1},
		{`[-1, 0) \cup (0, 1]`, `\boxed{(0, 1] \cup [-1, 0)}`, 1},
		{`[-1, 0) \cup (0, 1]`, `\boxed{[-1, 0] \cup (0, 1]}`, 0},
		{`\{1, 2\}`, `\boxed{\{2, 1\}}`, 1},
		{"-2, 1", `\boxed{1,-2}`, 1},
		{"-2, 1", `\boxed{-2}`, 0},
		{"1, 2, 3", `\boxed{1, 2}`, 0},
		{`\{-12, -11, -10\}`, `\boxed{-12;-11;-10}`, 1},
		{"6 and 8", `\boxed{6 \text{ and } 8}`, 1},
		{"19, 46, and 82", `\boxed{19, 46, \text{ and } 82}`, 1},
		{"(2, 2), (1, 3)", `\boxed{(1, 3), (2, 2)}`, 1},
		{"(2, 2), (1, 3)", `\boxed{(2, 2)}`, 0},
		{`1 \pm \sqrt{19}`, `\boxed{1 \pm \sqrt{19}}`, 1},
		{`1 \pm \sqrt{19}`, `\boxed{1+\sqrt{19}, 1-\sqrt{19}}`, 1},
		{`1 \pm \sqrt{19}`, `\boxed{1+\sqrt{19}}`, 0},
		{`\pm 2021`, `\boxed{\{-2021, 2021\}}`, 1},
		{`\{1\pm\sqrt{5},-2\}`, `\boxed{-2, 1+\sqrt5, 1-\sqrt 5}`, 1},
		{`\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}`, `\boxed{\begin{bmatrix}1&2\\3&4\end{bmatrix}}`, 1},
		{`\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}`, `\boxed{\begin{pmatrix}1&2\\3&5\end{pmatrix}}`, 0},
		{`\begin{pmatrix} 1 \\ 2 \end{pmatrix}`, `\boxed{\begin{pmatrix} 1 & 2 \end{pmatrix}}`, 0},
		{"7:32", `\boxed{7:32}`, 1},
		{"7:32", `\boxed{14:64}`, 0},
		// Relations: "x = 3" against 3, equations, inequalities.
		{"3", `\boxed{x = 3}`, 1},
		{"x = 3", `\boxed{3}`, 1},
		{"3", `\boxed{f(2) = 3}`, 1},
		{"3", `\boxed{a_{1} = 3}`, 1},
		{"(3,2)", `\boxed{(p,q) = (3,2)}`, 1},
		{"11", `\boxed{x = 5+5+1 = 11}`, 1},
		{"7", `\boxed{3 + 4 = 7}`, 1},
		{"11a+c", `\boxed{7 = 11a+c}`, 0},
		{"x = 3", `\boxed{y = 3}`, 0},
		{"2x+4y-3=0", `\boxed{y=-\frac{1}{2}x+\frac{3}{4}}`, 1},
		{"34x+45y-20z+100=0", `\boxed{-34x-45y+20z-100=0}`, 1},
		{"x^2/4 + y^2/3 = 1", `\boxed{x^2/16 + y^2/12 = 1/4}`, 1},
		{"2x + z = 1", `\boxed{1}`, 0},
		{"a +3z = 0", `\boxed{0}`, 0},
		{`x \geq 5`, `\boxed{x >= 5}`, 1},
		{`x \leq 5`, `\boxed{5 \geq x}`, 1},
		{"x < 1", `\boxed{-x > -1}`, 1},
		{"x < 1", `\boxed{x > -1}`, 0},
		{`x \geq 5`, `\boxed{x \leq 5}`, 0},
		{`x \ne 3`, `\boxed{x \neq 3}`, 1},
		{"x > 5", `\boxed{(5, \infty)}`, 1},
		{"x > 5", `\boxed{[5, \infty)}`, 0},
		{`-2 \le x \le 7`, `\boxed{x \in [-2,7]}`, 1},
		{`-2 \le x < 7`, `\boxed{[-2,7]}`, 0},
		{`x = \frac{1}{3}`, `\boxed{x \approx 0.33}`, 0},
		{"11", `\boxed{x \approx 11}`, 1},
		{`1/3`, `\boxed{x = \frac13 \approx 0.33}`, 1},
		{"x = 1, y = 2", `\boxed{y = 2, x = 1}`, 1},
		{"x = 1, y = 2", `\boxed{x = 2, y = 1}`, 0},
		{"x = 1, y = 2", `\boxed{1, 2}`, 1},
		{"x = 1, y = 2", `\boxed{2, 1}`, 0},
		{"a = 4, -8, -10", `\boxed{-10, -8, 4}`, 1},
		// Text answers.
		{`\text{Evelyn}`, `\boxed{\text{Evelyn}}`, 1},
		{`\text{Evelyn}`, `\boxed{Evelyn}`, 1},
		{`\text{odd}`, `\boxed{odd}`, 1},
		{`\text{odd}`, `\boxed{\text{even}}`, 0},
		{`\text{(C)}`, `\boxed{C}`, 1},
		{`\text{(C)}`, `\boxed{\textbf{(C)}}`, 1},
		{`\text{(C)}`, `\boxed{D}`, 0},
		{"E", `\boxed{\mathrm{E}}`, 1},
		{`e`, `\boxed{\mathrm{e}}`, 1},
		{"no solution", `\boxed{\text{No solution}}`, 1},
		{`204_5`, `\boxed{204_5}`, 1},
		{`204_5`, `\boxed{54}`, 0}, // a base-5 numeral is compared as written
		// A ground truth that is a whole solution.
		{"Janet sells 16 - 3 - 4 = 9 eggs.\n#### 18", `\boxed{18}`, 1},
		{`so the area is $\boxed{6}$.`, "The answer is 6", 1},
		// False-positive traps: all must score 0.
		{"12", `\boxed{12 \text{ or } 13}`, 0},
		{"12", `\boxed{12 or 13}`, 0},
		{"12", `\boxed{12, 13}`, 0},
		{"12", `\boxed{12} or \boxed{13}`, 0},
		{"12", `First \boxed{12}. Wait, no: \boxed{13}`, 0},
		{"13", `First \boxed{12}. Wait, no: \boxed{13}`, 0},
		{"12", `\boxed{13}. Hmm, maybe \boxed{12}`, 0},
		{"12", `\boxed{12}\boxed{13}`, 0},
		{"12", `\boxed{x = 12, y = 13}`, 0},
		{"12", `\boxed{123}`, 0},
		{"12", `\boxed{1.2}`, 0},
		{"12", `\boxed{12.5}`, 0},
		{"12", `\boxed{-12}`, 0},
		{"12", `\boxed{\pm 12}`, 0},
		{"12", `\boxed{12x}`, 0},
		{"12", `\boxed{12^2}`, 0},
		{"12", `\boxed{x}`, 0},
		{"12", `\boxed{12 < 13}`, 0},
		{"12", `\boxed{\text{not } 12}`, 0},
		{"12", "The answer is not 12.", 0},
		{"12", "The answer is 12 or 13.", 0},
		{"12", `<answer>12 or 13</answer>`, 0},
		{"12", "#### 12 or 13", 0},
		{"12", `\boxed{\{12, 13\}}`, 0},
		{"12", `\boxed{[12, 13]}`, 0},
		{"0", `\boxed{x - x + 1}`, 0},
		{"2", `\boxed{\frac{1+\sqrt{5}}{2}}`, 0},
		{"4", `\boxed{\frac{34}{16}+\frac{\sqrt{1358}}{16}}`, 0},
		{`1\sqrt{19}`, `\boxed{1}`, 0},
		{"(a+5)(b+2)", `\boxed{(+5)(b+2)}`, 0},
		{"12", `The answer is \boxed{12}` + strings.Repeat(`\boxed{`, 100), 1}, // unclosed boxes skipped
		{"12", strings.Repeat(`\boxed{1} `, 70) + `\boxed{12}`, 0},             // too many boxes
		{"1", `\boxed{` + strings.Repeat("(", 200) + "1" + strings.Repeat(")", 200) + `}`, 0},
	}
	for _, c := range cases {
		if got := Score("math", c.truth, c.response); got != c.want {
			ans, ok := Extract("math", c.response)
			t.Errorf("truth %q response %q: %v, want %v (extracted %q %v)", c.truth, c.response, got, c.want, ans, ok)
		}
	}
}

// The final answer each response marks, as the verifier reads it.
func TestMathExtract(t *testing.T) {
	cases := []struct {
		response, want string
		ok             bool
	}{
		{`\boxed{5}`, "5", true},
		{`a \boxed{1} then \boxed{\frac{1}{2}}`, "", false}, // boxes disagree
		{`a \boxed{3} then \boxed{3}`, "3", true},
		{`\boxed{(1, 2)}, \boxed{(2, 1)}`, "(1, 2), (2, 1)", true},
		{`roots \boxed{-2} and \boxed{1}. So \boxed{-2} and \boxed{1}`, "-2, 1", true},
		{`\boxed{x^{2}}`, "x^{2}", true},
		{"The answer is: $\\frac{3}{4}$, as shown.", `\frac{3}{4}`, true},
		{"Answer:\n\n42", "42", true},
		{"#### 1,000", "1,000", true},
		{"<answer> 7 </answer>", "7", true},
		{"the answers are 7", "", false},
		{"no marker at all", "", false},
		{`\boxed{7} and the answer is correct`, "7", true},
	}
	for _, c := range cases {
		got, ok := Extract("math", c.response)
		if ok != c.ok || ok && got != c.want {
			t.Errorf("%q: %q %v, want %q %v", c.response, got, ok, c.want, c.ok)
		}
	}
}

func TestGSM8KScore(t *testing.T) {
	cases := []struct {
		truth, response string
		want            float64
	}{
		{"72", "Natalia sold 48/2 = 24 clips in May.\n48+24 = 72\n#### 72", 1},
		{"72", "#### 72.", 1},
		{"72", "#### $72", 1},
		{"72", "#### 72.00", 1},
		{"72", "#### 72 clips", 1},
		{"1200", "#### 1,200", 1},
		{"1200", "#### $1,200.", 1},
		{"-5", "#### -5", 1},
		{"25", "#### 25%", 1},
		{"72", `The answer is \boxed{72}.`, 1},
		{"72", "The answer is 72.", 1},
		{"72", "Answer: 72", 1},
		{"Weng earns 12/60 = $0.2 per minute.\n#### 10", "#### 10", 1},
		{"72", "#### 73", 0},
		{"72", "#### 72 or 73", 0},
		{"72", "#### 72, 73", 0},
		{"72", "#### 144/2", 0}, // one number, not an expression
		{"72", `\boxed{72} ... \boxed{73}`, 0},
		{"72", "#### 72\nThe answer is 73", 0}, // a later final answer disagrees
		{"72", "#### 72\nWait, the answer is 73.", 0},
		{"72", "\\boxed{72}\n#### 72\nThe answer is 73", 0},
		{"72", "#### 72\n<answer>73</answer>", 0},
		{"72", "#### 72\nThe answer is 72.", 1},
		{"72", "#### 72\nI hope the answer is correct.", 1}, // prose
		// Hedges and scale words are no units.
		{"72", `#### 72 \text{ or seventy-three}`, 0},
		{"72", `\boxed{72 \text{ or seventy-three}}`, 0},
		{"72", `#### 72 \text{ apples and three pears}`, 0},
		{"72", "#### 72 thousand", 0},
		{"72", "#### 72 million", 0},
		{"72", "#### 72 twice", 0},
		{"72", "#### 72 maybe", 0},
		{"72", "#### 72 apples", 1},
		{"72", "#### $72", 1},
		{"72", `#### 72 \text{ apples}`, 1},
		{"72", "#### 7.2", 0},
		{"72", "72", 0},
		{"72", `\boxed{7 2}`, 0},
		{"0.5", `\boxed{\frac{1}{2}}`, 0},
		{"72", "#### 72\n" + `\boxed{73}`, 0},
	}
	for _, c := range cases {
		if got := Score("openai/gsm8k", c.truth, c.response); got != c.want {
			ans, ok := Extract("gsm8k", c.response)
			t.Errorf("truth %q response %q: %v, want %v (extracted %q %v)", c.truth, c.response, got, c.want, ans, ok)
		}
	}
}

// verl's data_source names select the verifiers; a verify-only verifier
// is no generator.
func TestVerifierNames(t *testing.T) {
	for name, want := range map[string]string{
		"math": "math", "lighteval/MATH": "math", "DigitalLearningGmbH/MATH-lighteval": "math",
		"HuggingFaceH4/MATH-500": "math", "hendrycks/competition_math": "math", "math_dapo": "math",
		"BytedTsinghua-SIA/DAPO-Math-17k": "math", "aime24": "math", "aime_2025": "math",
		"numina_olympiads": "math", "numina_cn_k12": "math",
		"gsm8k": "gsm8k", "openai/gsm8k": "gsm8k",
		"arithmetic": "arithmetic", "countdown": "countdown", "linear": "linear",
	} {
		v, err := LookupVerifier(name)
		if err != nil || v.Name() != want {
			t.Errorf("%s: %v %v, want %s", name, v, err, want)
		}
	}
	for _, name := range []string{"", "nonsense", "codecontests", "Math"} {
		if _, err := LookupVerifier(name); err == nil {
			t.Errorf("%q has a verifier", name)
		}
	}
	if _, err := Get("math"); err == nil || !strings.Contains(err.Error(), "no generator") {
		t.Errorf("Get(math): %v", err)
	}
	if Score("nonsense", "1", `\boxed{1}`) != 0 || Score("aime25", "1", `\boxed{1}`) != 1 {
		t.Error("Score dispatch")
	}
	if a, ok := Extract("countdown", "Answer: 1+2"); !ok || a != "1+2" {
		t.Errorf("Extract(countdown): %q %v", a, ok)
	}
	names := strings.Join(VerifierNames(), " ")
	for _, n := range []string{"arithmetic", "math", "gsm8k", "openai/gsm8k", "aime*", "numina_*"} {
		if !strings.Contains(names, n) {
			t.Errorf("VerifierNames lacks %s: %s", n, names)
		}
	}
}

// The evaluator computes exact rationals where it can.
func TestMathEvalExact(t *testing.T) {
	for expr, want := range map[string]string{
		`\frac{1}{3}+\frac{1}{6}`: "1/2",
		`2^{-2}`:                  "1/4",
		`\sqrt{\frac{9}{4}}`:      "3/2",
		`(-8)^{1/3}`:              "",
		`\sqrt[3]{27}`:            "3",
		`3!`:                      "6",
		`2\frac{3}{4}`:            "11/4",
		`-2\frac{3}{4}`:           "-11/4",
		`1.25`:                    "5/4",
		`\lfloor 7/2 \rfloor`:     "3",
		`\lceil 7/2 \rceil`:       "4",
		`\lfloor -7/2 \rfloor`:    "-4",
		`2^{3^2}`:                 "512",
		`\binom{10}{3}`:           "120",
		`10\%`:                    "",
		`2^{2100}/2^{2098}`:       "4",
		`10^{10^{10}}`:            "",
		`2^{70000}`:               "",
		`(170!)!`:                 "",
	} {
		b := &budget{left: stepBudget}
		n, err := parseExpr(expr, b)
		if err != nil {
			if want != "" {
				t.Errorf("%s: %v", expr, err)
			}
			continue
		}
		v, err := eval(n, nil, b)
		if err != nil {
			t.Errorf("%s: %v", expr, err)
			continue
		}
		switch {
		case want == "" && v.r != nil:
			t.Errorf("%s: exact %v, want a float", expr, v.r)
		case want != "":
			w, _ := new(big.Rat).SetString(want)
			if v.r == nil || v.r.Cmp(w) != 0 {
				t.Errorf("%s = %v (%v), want %s", expr, v.r, v.f, want)
			}
		}
	}
}

// Pathological answers are refused quickly: work per answer is bounded.
func TestMathBounded(t *testing.T) {
	long := strings.Repeat("x+", 490) + "x"
	cases := []string{
		`\boxed{` + strings.Repeat(`\frac{`, 300) + "1" + strings.Repeat("}{2}", 300) + `}`,
		`\boxed{` + strings.Repeat("(", 499) + strings.Repeat(")", 499) + `}`,
		`\boxed{` + long + `}`,
		`\boxed{2^{2^{2^{2^{2^{2^{2^{2}}}}}}}}`,
		`\boxed{(x+1)^{1000000}}`,
		`\boxed{` + strings.Repeat("9", 900) + `!}`,
		`\boxed{` + strings.Repeat("1,", 400) + `1}`,
		`\boxed{` + strings.Repeat(`\sqrt{`, 400) + "2" + strings.Repeat("}", 400) + `}`,
		strings.Repeat("The answer is ", 50000) + "1",
		strings.Repeat(`\boxed{\boxed{`, 20000),
		strings.Repeat("{", 1<<20),
		// Exact arithmetic near the 1<<16-bit bound.
		`\boxed{` + strings.Repeat(`\frac{3^{9000}}{7^{9000}}+\frac{5^{8000}}{11^{8000}}+`, 200) + "1}",
		`\boxed{` + strings.Repeat(`(\frac{3}{7})^{20000}\cdot`, 300) + "1}",
		`\boxed{` + strings.Repeat(`\frac{(x+1)^{7000}}{(x-1)^{7000}}+`, 100) + "1}",
		`\boxed{` + strings.Repeat(`\binom{1000}{500}^{30}-`, 200) + "1}",
		`\boxed{` + strings.Repeat(`1000!\cdot 999!-`, 300) + "1}",
	}
	for _, c := range cases {
		start := time.Now()
		Score("math", long, c)
		Score("math", c, c)
		Score("gsm8k", "1", c)
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%.40q...: %v", c, d)
		}
	}
}

// FuzzMathScore checks that the math and gsm8k verifiers never panic and
// stay fast on any input, and that the answer Extract reads from a
// response, used as the ground truth, verifies that response.
func FuzzMathScore(f *testing.F) {
	for _, s := range []string{
		"5", `\frac{1}{2}`, "(1,2]", `x^2+2x+1`, `1 \pm \sqrt{19}`, `\begin{pmatrix}1&2\\3&4\end{pmatrix}`,
		`x \in [0, 1)`, `12,345`, `\text{(C)}`, `28\%`, `-2 \le x \le 7`, `2x+4y=3`, `\sqrt[3]{x^2}`,
		`10^{\frac{-5+\sqrt{13}}{6}}`, `\{1, 2\}`, `a = 4, -8`,
	} {
		f.Add(s, `The answer is \boxed{`+s+`}.`)
	}
	f.Fuzz(func(t *testing.T, truth, response string) {
		start := time.Now()
		s := scoreMath(truth, response)
		if s != 0 && s != 1 {
			t.Fatalf("score %v", s)
		}
		gsm8kVerifier{}.Score(truth, response)
		if ans, ok := (mathVerifier{}).Extract(response); ok && truthAnswer(ans) == ans && scoreMath(ans, response) != 1 {
			// The extracted answer, as the truth, must verify the response
			// (unless, as a ground truth, it reads as another answer: one
			// holding a \boxed{} or "####").
			if _, err := parseAnswerOf(ans); err == nil {
				t.Fatalf("extracted %q does not verify its own response %q", ans, response)
			}
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("%v on %q %q", d, truth, response)
		}
	})
}

// parseAnswerOf parses a raw answer as the verifier does.
func parseAnswerOf(s string) (*node, error) {
	c, ok := cleanAnswer(s)
	if !ok {
		return nil, errSyntax
	}
	return parseAnswer(c, &budget{left: stepBudget})
}

// Rows added for the rules on decimals and "####" headings.
func TestMathScoreMore(t *testing.T) {
	cases := []struct {
		truth, response string
		want            float64
	}{
		{"2", `\boxed{2.0000000001}`, 0},             // two terminating decimals differ
		{"0.1", `\boxed{0.1000000000001}`, 0},        // the same
		{`\frac{1}{7}`, `\boxed{0.142857142857}`, 1}, // twelve digits of a repeating fraction
		{`\frac{1}{7}`, `\boxed{0.1428}`, 0},
		{"5", "#### Step 1\n$2+3$\n\\boxed{5}\n\n#### Verification\nIt checks out.", 1},
		{"5", "#### 5\n\n#### Check\nok", 1},
		{"5", `\boxed{5}` + "\n#### 6", 0}, // a final "####" answer that disagrees
		{`\infty`, `\boxed{\infty}`, 1},
		{`\infty`, `\boxed{-\infty}`, 0},
		{"0", `\boxed{\frac{0}{0}}`, 0},
		{"12", `\boxed{12\%}`, 1},   // a percent sign is a unit
		{"12", `\boxed{1200\%}`, 0}, // 12 is no proportion: 1200% reads 1200
		{"12", `\boxed{13\%}`, 0},
		{`\frac{1}{3}`, `\boxed{0.\overline{3}}`, 1},
		{`\frac{1}{6}`, `\boxed{0.1\overline{6}}`, 1},
		{`\frac{41}{333}`, `\boxed{0.\overline{123}}`, 1},
		{`\frac{1}{3}`, `\boxed{0.\overline{33}}`, 1},
		{`\frac{1}{3}`, `\boxed{0.\overline{4}}`, 0},
		{`\emptyset`, `\boxed{\varnothing}`, 1},
		{`\emptyset`, `\boxed{\{\}}`, 1},
		{`\emptyset`, `\boxed{\{0\}}`, 0},
		{`\emptyset`, `\boxed{0}`, 0},
	}
	for _, c := range cases {
		if got := Score("math", c.truth, c.response); got != c.want {
			ans, ok := Extract("math", c.response)
			t.Errorf("truth %q response %q: %v, want %v (extracted %q %v)", c.truth, c.response, got, c.want, ans, ok)
		}
	}
	if got := Score("gsm8k", "72", "#### 72\n\n#### Explanation\nWe add."); got != 1 {
		t.Errorf("gsm8k heading after the answer: %v", got)
	}
}
