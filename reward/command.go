package reward

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sync"
	"time"

	"github.com/keel-rl/keel/internal/jsonfix"
)

// maxLine bounds a command's answer line (a variable for tests).
var maxLine = maxAnswer

// killWait bounds how long kill waits for a killed process's stdout to
// end and for its exit (a variable for tests).
var killWait = 2 * time.Second

// pool runs up to Options.Concurrency processes of the grader command,
// each answering one request line at a time; a process that dies, hangs
// past the timeout, cannot be written to or breaks the protocol's order
// is killed (its process group) and its slot started afresh on next use,
// up to Options.MaxRestarts restarts in all.
type pool struct {
	opt  Options
	free chan *proc // a slot per process; nil: not running

	mu       sync.Mutex
	starts   int
	closed   bool
	running  map[*proc]bool
	restarts int
}

// proc is one running process of the command.
type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.ReadCloser
	lines  chan []byte   // stdout's lines; closed when stdout ends
	killed chan struct{} // closed by kill: lines are dropped
	once   sync.Once
	done   chan struct{} // closed once the process is waited for
	err    error         // why stdout ended, or the exit's; set before lines is closed
}

func newPool(opt Options) *pool {
	p := &pool{opt: opt, free: make(chan *proc, opt.Concurrency), running: map[*proc]bool{}}
	for range opt.Concurrency {
		p.free <- nil
	}
	return p
}

// start starts a process, counting restarts beyond the first start of
// each slot.
func (p *pool) start() (*proc, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("command: client closed")
	}
	if p.starts >= p.opt.Concurrency {
		if p.restarts >= p.opt.MaxRestarts {
			return nil, fmt.Errorf("command %q: restarted %d times already (max_restarts: %d)", p.opt.Command[0], p.restarts, p.opt.MaxRestarts)
		}
		p.restarts++
	}
	p.starts++
	cmd := exec.Command(p.opt.Command[0], p.opt.Command[1:]...)
	ownGroup(cmd)
	// Wait closes the pipes this long after the exit even when a child
	// still holds them (stderr copied to a non-file writer).
	cmd.WaitDelay = killWait
	if p.opt.Stderr != nil {
		cmd.Stderr = p.opt.Stderr
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("command %q: %w", p.opt.Command[0], err)
	}
	pr := &proc{cmd: cmd, stdin: stdin, stdout: stdout, lines: make(chan []byte),
		killed: make(chan struct{}), done: make(chan struct{})}
	p.running[pr] = true
	go func() {
		rerr := pr.read(stdout)
		if rerr != nil {
			killGroup(cmd) // an overlong line: nothing more is read
		}
		werr := cmd.Wait()
		if rerr == nil {
			rerr = werr
		}
		pr.err = rerr
		p.mu.Lock()
		delete(p.running, pr)
		p.mu.Unlock()
		close(pr.lines)
		close(pr.done)
	}()
	return pr, nil
}

// read passes stdout's lines to pr.lines until stdout ends, or until a
// line exceeds maxLine (the error returned).
func (pr *proc) read(stdout io.Reader) error {
	br := bufio.NewReaderSize(stdout, 1<<16)
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxLine+1 {
			return fmt.Errorf("an answer line longer than %d bytes", maxLine)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return nil // EOF or a closed pipe: Wait tells why
		}
		select {
		case pr.lines <- line:
		case <-pr.killed:
		}
		line = nil
	}
}

// kill ends the process's group and waits, a bounded time, for its
// stdout to end and its exit; a process outliving that is left behind
// with its stdout closed.
func (pr *proc) kill() {
	pr.once.Do(func() { close(pr.killed) })
	killGroup(pr.cmd)
	pr.stdin.Close()
	t := time.NewTimer(killWait)
	defer t.Stop()
	select {
	case <-pr.done:
		return
	case <-t.C:
	}
	pr.stdout.Close() // a child outside the group holds stdout: stop reading
	t.Reset(killWait)
	select {
	case <-pr.done:
	case <-t.C:
	}
}

// answerRequest reads the request field of an answer line ("" when the
// line has none or is not JSON: decode reports it).
func answerRequest(line []byte) (string, bool) {
	var probe struct {
		Request *string `json:"request"`
	}
	if json.Unmarshal(jsonfix.QuoteNonFinite(line), &probe) != nil || probe.Request == nil {
		return "", false
	}
	return *probe.Request, true
}

func (p *pool) do(ctx context.Context, body []byte, nonce string) ([]byte, error) {
	var pr *proc
	select {
	case pr = <-p.free:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a command process: %w", ctx.Err())
	}
	defer func() { p.free <- pr }()
	name := p.opt.Command[0]
	// fail kills the process (its slot restarts on next use).
	fail := func(err error) ([]byte, error) {
		pr.kill()
		pr = nil
		return nil, err
	}
	if pr != nil {
		select { // a line while no request was pending
		case l, ok := <-pr.lines:
			if !ok {
				return fail(fmt.Errorf("command %q exited while idle: %v", name, pr.err))
			}
			return fail(fmt.Errorf("command %q wrote a line while no request was pending (starts %q): killed; it restarts on the next request", name, head(l)))
		default:
		}
	} else {
		var err error
		if pr, err = p.start(); err != nil {
			return nil, err
		}
	}
	line := append(append([]byte(nil), body...), '\n')
	wrote := make(chan error, 1)
	go func(w io.Writer) {
		_, err := w.Write(line)
		wrote <- err
	}(pr.stdin)
	var ans []byte
	for ans == nil || wrote != nil {
		select {
		case err := <-wrote:
			if err != nil {
				pr.kill()
				err = fmt.Errorf("command %q died: %v (exit: %v)", name, err, pr.exit())
				pr = nil
				return nil, err
			}
			wrote = nil
		case l, ok := <-pr.lines:
			if !ok {
				return fail(fmt.Errorf("command %q exited before answering: %v", name, pr.err))
			}
			if ans != nil {
				return fail(fmt.Errorf("command %q wrote a second line for one request (starts %q)", name, head(l)))
			}
			if got, ok := answerRequest(l); ok && got != nonce {
				return fail(fmt.Errorf("command %q: answer's field \"request\": %q, want the pending request's %q (a stray line on stdout?): killed; it restarts on the next request", name, got, nonce))
			}
			ans = l
		case <-ctx.Done():
			what := "no answer"
			if wrote != nil {
				what = "the request was not read"
			}
			return fail(fmt.Errorf("command %q: %s: %w (killed; it restarts on the next request)", name, what, ctx.Err()))
		}
	}
	return ans, nil
}

func (p *pool) close() error {
	p.mu.Lock()
	p.closed = true
	procs := make([]*proc, 0, len(p.running))
	for pr := range p.running {
		procs = append(procs, pr)
	}
	p.mu.Unlock()
	for _, pr := range procs {
		pr.kill()
	}
	return nil
}

// exit is why the process ended, once it has been waited for.
func (pr *proc) exit() error {
	select {
	case <-pr.done:
		return pr.err
	default:
		return errors.New("still running, left behind")
	}
}
