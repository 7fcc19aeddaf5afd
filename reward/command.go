package reward

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sync"
)

// pool runs up to Options.Concurrency processes of the grader command,
// each answering one request line at a time; a process that dies, hangs
// past the timeout or cannot be written to is killed and its slot started
// afresh on next use, up to Options.MaxRestarts restarts in all.
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
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan []byte // stdout's lines; closed when stdout ends
	err   error       // the exit's, set before lines is closed
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
			return nil, fmt.Errorf("command %q: restarted %d times already (max_restarts)", p.opt.Command[0], p.restarts)
		}
		p.restarts++
	}
	p.starts++
	cmd := exec.Command(p.opt.Command[0], p.opt.Command[1:]...)
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
	pr := &proc{cmd: cmd, stdin: stdin, lines: make(chan []byte)}
	p.running[pr] = true
	go func() {
		br := bufio.NewReaderSize(stdout, 1<<16)
		for {
			line, err := br.ReadBytes('\n')
			if len(line) > 0 && err == nil {
				pr.lines <- line
			}
			if err != nil {
				break
			}
		}
		pr.err = cmd.Wait()
		p.mu.Lock()
		delete(p.running, pr)
		p.mu.Unlock()
		close(pr.lines)
	}()
	return pr, nil
}

// kill ends a process and waits for its reader to finish.
func (pr *proc) kill() {
	pr.stdin.Close()
	pr.cmd.Process.Kill()
	for range pr.lines {
	}
}

func (p *pool) do(ctx context.Context, body []byte) ([]byte, error) {
	var pr *proc
	select {
	case pr = <-p.free:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a command process: %w", ctx.Err())
	}
	defer func() { p.free <- pr }()
	if pr == nil {
		var err error
		if pr, err = p.start(); err != nil {
			return nil, err
		}
	}
	line := append(append([]byte(nil), body...), '\n')
	if _, err := pr.stdin.Write(line); err != nil {
		pr.kill()
		err = fmt.Errorf("command %q died: %v (exit: %v)", p.opt.Command[0], err, pr.err)
		pr = nil
		return nil, err
	}
	select {
	case ans, ok := <-pr.lines:
		if !ok {
			err := fmt.Errorf("command %q exited before answering: %v", p.opt.Command[0], pr.err)
			pr = nil
			return nil, err
		}
		return ans, nil
	case <-ctx.Done():
		pr.kill()
		pr = nil
		return nil, fmt.Errorf("command %q: no answer: %w (killed; it restarts on the next request)", p.opt.Command[0], ctx.Err())
	}
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
