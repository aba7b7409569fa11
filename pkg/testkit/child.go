package testkit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// A Child is this test binary run again as a server of its own (an ext_proc
// floor, an EPP), so that its heap, collector and CPU are not the test's:
// a benchmark then measures each server as the process it would be when
// deployed. The parent talks to it in JSON lines over the child's stdin and
// stdout (ServeChild is the child's side); closing its stdin stops it, so
// that a child never outlives its test.
type Child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	logs  LogBuffer
	mu    sync.Mutex

	stopOnce sync.Once
	stopErr  error
}

// childRequest and childAnswer are the lines of the protocol.
type childRequest struct {
	Op  string          `json:"op"`
	Arg json.RawMessage `json:"arg,omitempty"`
}

type childAnswer struct {
	Err   string          `json:"err,omitempty"`
	Value json.RawMessage `json:"value,omitempty"`
}

// maxChildLine bounds one line of the protocol either way.
const maxChildLine = 64 << 20

// opStats is answered by ServeChild itself, with the child's
// ProcessStats.
const opStats = "stats"

// StartChild runs this test binary again, with env set to spec, and
// decodes the first line it writes into hello. The binary's TestMain must
// hand such a run to the child's code before m.Run (see fleet.Main,
// envoy.Main). The child stops when the test ends, unless Stop stopped it
// before.
func StartChild(tb testing.TB, env, spec string, hello any) *Child {
	tb.Helper()
	c := &Child{cmd: exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")}
	c.cmd.Env = append(os.Environ(), env+"="+spec)
	c.cmd.Stderr = &c.logs
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		tb.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	c.out = bufio.NewReader(stdout)
	tb.Cleanup(func() {
		if err := c.Stop(); err != nil {
			tb.Error(err)
		}
	})
	line, err := c.out.ReadBytes('\n')
	if err != nil {
		tb.Fatalf("%s process: no greeting: %v (does TestMain hand it over?)\n%s", env, err, c.logs.String())
	}
	if err := json.Unmarshal(line, hello); err != nil {
		tb.Fatalf("%s process greeted with %q: %v\n%s", env, line, err, c.logs.String())
	}
	return c
}

// Pid is the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Call sends the child op with arg and decodes its answer into value
// (which may be nil). One call runs at a time.
func (c *Child) Call(op string, arg, value any) error {
	req := childRequest{Op: op}
	if arg != nil {
		b, err := json.Marshal(arg)
		if err != nil {
			return err
		}
		req.Arg = b
	}
	line, err := json.Marshal(req)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.stdin.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("child %d: %s: %w\n%s", c.Pid(), op, err, c.logs.String())
	}
	line, err = c.out.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("child %d: %s: %w\n%s", c.Pid(), op, err, c.logs.String())
	}
	var ans childAnswer
	if err := json.Unmarshal(line, &ans); err != nil {
		return fmt.Errorf("child %d: %s answered %q: %w", c.Pid(), op, line, err)
	}
	if ans.Err != "" {
		return fmt.Errorf("child %d: %s: %s", c.Pid(), op, ans.Err)
	}
	if value != nil {
		if err := json.Unmarshal(ans.Value, value); err != nil {
			return fmt.Errorf("child %d: %s answered %q: %w", c.Pid(), op, ans.Value, err)
		}
	}
	return nil
}

// Stats are the child's ProcessStats now.
func (c *Child) Stats() (ProcessStats, error) {
	var s ProcessStats
	err := c.Call(opStats, nil, &s)
	return s, err
}

// Stop closes the child's stdin and waits for it to exit, killing it
// after 10s; it returns the child's failure, if any, with its log. Later
// calls return the first's result.
func (c *Child) Stop() error {
	c.stopOnce.Do(func() {
		_ = c.stdin.Close()
		done := make(chan error, 1)
		go func() { done <- c.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				c.stopErr = fmt.Errorf("child %d: %w\n%s", c.Pid(), err, c.logs.String())
			}
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Kill()
			<-done
			c.stopErr = fmt.Errorf("child %d did not stop within 10s of its stdin closing\n%s", c.Pid(), c.logs.String())
		}
	})
	return c.stopErr
}

// ServeChild is a Child's side: it writes hello as the first line, then
// answers each request line with handle's value or error, until in ends.
// The op "stats" it answers itself, with this process's ProcessStats; a
// request it cannot read is answered with an error, and a line longer
// than 64 MiB ends it with one.
func ServeChild(in io.Reader, out io.Writer, hello any, handle func(op string, arg json.RawMessage) (any, error)) error {
	w := bufio.NewWriter(out)
	enc := json.NewEncoder(w)
	if err := enc.Encode(hello); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), maxChildLine)
	for sc.Scan() {
		var (
			req   childRequest
			value any
			err   error
		)
		switch err = json.Unmarshal(sc.Bytes(), &req); {
		case err != nil:
			err = fmt.Errorf("request: %w", err)
		case req.Op == opStats:
			value = ReadProcessStats()
		case handle == nil:
			err = fmt.Errorf("no op %q", req.Op)
		default:
			value, err = handle(req.Op, req.Arg)
		}
		var ans childAnswer
		if err != nil {
			ans.Err = err.Error()
		} else if ans.Value, err = json.Marshal(value); err != nil {
			ans = childAnswer{Err: err.Error()}
		}
		if err := enc.Encode(ans); err != nil {
			return err
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("child: read requests: %w", err)
	}
	return nil
}
