package deploy

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// dockerfile is deploy/images/Dockerfile's stages, as far as the chart's
// images depend on them.
type dockerfile struct {
	built  []string // the ./cmd/ packages the build stage builds
	stages map[string]imageStage
}

type imageStage struct {
	copied, entrypoint, user string
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("images", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := dockerfile{stages: map[string]imageStage{}}
	from := regexp.MustCompile(`^FROM \S+ AS (\S+)$`)
	copyBin := regexp.MustCompile(`^COPY --from=build /out/(\S+) /(\S+)$`)
	var stage string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if m := from.FindStringSubmatch(line); m != nil {
			stage = m[1]
			if stage != "build" {
				df.stages[stage] = imageStage{}
			}
			continue
		}
		s := df.stages[stage]
		switch {
		case stage == "build" && strings.Contains(line, "go build"):
			for _, f := range strings.Fields(line) {
				if p, ok := strings.CutPrefix(f, "./cmd/"); ok {
					df.built = append(df.built, p)
				}
			}
		case stage == "build":
		case copyBin.MatchString(line):
			m := copyBin.FindStringSubmatch(line)
			if m[1] != m[2] {
				t.Errorf("stage %s copies /out/%s to /%s: a binary keeps its name", stage, m[1], m[2])
			}
			s.copied = m[1]
		case strings.HasPrefix(line, "ENTRYPOINT "):
			s.entrypoint = strings.TrimPrefix(line, "ENTRYPOINT ")
		case strings.HasPrefix(line, "USER "):
			s.user = strings.TrimPrefix(line, "USER ")
		}
		if stage != "build" && stage != "" {
			df.stages[stage] = s
		}
	}
	return df
}

// chartImages is every image the pods of objs run.
func chartImages(objs []*unstructured.Unstructured) []string {
	var images []string
	for _, o := range objs {
		for _, field := range []string{"containers", "initContainers"} {
			cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", field)
			for _, c := range cs {
				if m, ok := c.(map[string]any); ok {
					if img, ok := m["image"].(string); ok {
						images = append(images, img)
					}
				}
			}
		}
	}
	return images
}

func TestTheChartsImagesAreBuiltByTheDockerfile(t *testing.T) {
	df := readDockerfile(t)
	names := map[string]bool{}
	for _, tc := range chartCases(t) {
		for _, img := range chartImages(render(t, tc.values, "default")) {
			repo, _, _ := strings.Cut(img, ":")
			if name, ok := strings.CutPrefix(repo, "ghcr.io/kvroute/"); ok {
				names[name] = true
			}
		}
	}
	if len(names) != 3 {
		t.Errorf("the chart runs kvroute images %v, want the EPP's, the relay's and the callout's", names)
	}
	for name := range names {
		s, ok := df.stages[name]
		switch {
		case !ok:
			t.Errorf("the chart runs ghcr.io/kvroute/%s, which deploy/images/Dockerfile has no target for", name)
		case s.copied != name || s.entrypoint != `["/`+name+`"]`:
			t.Errorf("target %s copies %q and runs %s, want its own binary as the entrypoint (the chart passes only args)", name, s.copied, s.entrypoint)
		case !slices.Contains(df.built, name):
			t.Errorf("target %s copies a binary the build stage does not build (it builds %v)", name, df.built)
		}
		// The chart's pods say runAsNonRoot and may leave the user to the
		// image, which the kubelet accepts only as a number other than 0.
		uid, _, _ := strings.Cut(s.user, ":")
		if n, err := strconv.Atoi(uid); err != nil || n == 0 {
			t.Errorf("target %s runs as user %q, want a numeric non-root user", name, s.user)
		}
	}
}

// The images' base has no C library: each binary must build with cgo off
// and link statically.
func TestTheImagesBinariesBuildStatic(t *testing.T) {
	df := readDockerfile(t)
	dir := t.TempDir()
	for _, name := range df.built {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(dir, name)
			cmd := exec.Command("go", "build", "-trimpath", "-o", out, "../cmd/"+name)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("CGO_ENABLED=0 go build ./cmd/%s: %v\n%s", name, err, b)
			}
			f, err := elf.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
					t.Errorf("./cmd/%s links dynamically (program header %v): the distroless static base cannot run it", name, p.Type)
				}
			}
		})
	}
}
