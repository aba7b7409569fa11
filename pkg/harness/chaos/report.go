package chaos

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

// WriteTable writes the results as a Markdown table with a heading line
// saying when and how they were made.
func WriteTable(w io.Writer, results []Result, took time.Duration) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured by `make chaos` (`go run ./cmd/kvsim chaos`) on %s in %s: %d scenarios, 3 pods, two EPP replicas each.\n\n",
		time.Now().UTC().Format("2006-01-02"), took.Round(time.Second), len(results))
	b.WriteString("| scenario | fault | settled | converged in | false at end | missing at end | end states (pod × replica) | peak false meanwhile | picks meanwhile (by state; over-claimed) | replicas agree |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	failed := 0
	for _, r := range results {
		settled := "yes"
		switch {
		case r.Err != nil:
			settled, failed = "error: "+r.Err.Error(), failed+1
		case !r.Converged || !r.Agree:
			settled, failed = "no: "+r.Detail, failed+1
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %d | %d of %d | %s | %d | %s | %s |\n",
			r.Scenario.Name, r.Scenario.What, settled, r.Converge.Round(time.Millisecond),
			r.False, r.Missing, r.Held, states(r.States), r.PeakFalse, picks(r.Picks), yesNo(r.Agree))
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("chaos: %d of %d scenarios did not settle", failed, len(results))
	}
	return nil
}

func states(m map[datalayer.StreamState]int) string {
	var parts []string
	for _, s := range datalayer.AllStreamStates {
		if n := m[s]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, s))
		}
	}
	return strings.Join(parts, ", ")
}

func picks(p Picks) string {
	var parts []string
	for _, s := range datalayer.AllStreamStates {
		if n := p.ByState[s]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, s))
		}
	}
	return fmt.Sprintf("%d (%s; %d)", p.Total, strings.Join(parts, ", "), p.Overclaimed)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// PageTitle heads the page `make chaos` writes (docs/results/chaos.md);
// the scenarios and the columns are explained on docs/reliability.md.
const PageTitle = "# Fault matrix: the latest run\n\nWritten by `make chaos`; do not edit by hand. The scenarios, the columns and how to read them: [docs/reliability.md](../reliability.md#the-fault-matrix).\n\n"

// WritePage writes the page at path: PageTitle, then table.
func WritePage(path string, table []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append([]byte(PageTitle), table...), 0o644)
}
