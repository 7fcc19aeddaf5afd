//go:build unix

package rl

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/keel-rl/keel/run"
)

// The child of TestRunKill9 runs until step 3 and kills itself with
// SIGKILL after that step's metrics record is written, before any
// checkpoint of step 3 or later.
func TestRunKill9Helper(t *testing.T) {
	dir := os.Getenv("KEEL_RL_KILL_DIR")
	if dir == "" {
		t.Skip("helper process for TestRunKill9")
	}
	var sets []string
	if k := os.Getenv("KEEL_RL_KILL_STALENESS"); k != "" {
		sets = append(sets, "rollout.staleness="+k)
	}
	Run(context.Background(), runRecipe(t, dir, sets...), false, Progress{Step: func(step, _ int, _ map[string]float64, _ time.Duration) {
		if step == 3 {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}})
	t.Fatal("not killed")
}

// kill -9 in the middle of a run loses the steps since the last
// checkpoint, and the resumed run equals one that never stopped: no torn
// or duplicated metrics line. So too with the rollout a step ahead, whose
// killed worker had sampled beyond the checkpoint.
func TestRunKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a child process")
	}
	for _, k := range []string{"", "1"} {
		t.Run("staleness="+k, func(t *testing.T) { kill9(t, k) })
	}
}

func kill9(t *testing.T, staleness string) {
	var sets []string
	if staleness != "" {
		sets = append(sets, "rollout.staleness="+staleness)
	}
	tmp := t.TempDir()
	killed := filepath.Join(tmp, "killed")
	cmd := exec.Command(os.Args[0], "-test.run=^TestRunKill9Helper$")
	cmd.Env = append(os.Environ(), "KEEL_RL_KILL_DIR="+killed, "KEEL_RL_KILL_STALENESS="+staleness)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child: %v\n%s", err, out.String())
	}
	recs, err := run.ReadMetrics(filepath.Join(killed, MetricsFile))
	if err != nil || len(recs) != 4 { // steps 0 (evaluation) to 3
		t.Fatalf("metrics after the kill: %d records, %v", len(recs), err)
	}
	r, err := ReadRecipe(filepath.Join(killed, RecipeFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), r, true, Progress{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Resumed != 2 {
		t.Fatalf("resumed from step %d, want the checkpoint of step 2", res.Resumed)
	}
	straight := filepath.Join(tmp, "straight")
	if _, err := Run(context.Background(), runRecipe(t, straight, sets...), false, Progress{}); err != nil {
		t.Fatal(err)
	}
	w1, m1 := readRun(t, straight)
	w2, m2 := readRun(t, killed)
	sameFiles(t, "killed at 3 and resumed", w1, w2, m1, m2)
}
