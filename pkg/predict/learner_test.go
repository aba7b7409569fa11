package predict

import (
	"math"
	"math/rand/v2"
	"testing"
)

// randomSystem is a symmetric positive definite M (XᵀX plus a ridge) and a
// right-hand side, as an observation's least squares makes them.
func randomSystem(rng *rand.Rand) (m [NumFeatures]Vector, rhs Vector) {
	var x [2 * NumFeatures][NumFeatures]float64
	for i := range x {
		for j := range NumFeatures {
			x[i][j] = rng.NormFloat64()
		}
	}
	for i := range NumFeatures {
		for j := range NumFeatures {
			for k := range x {
				m[i][j] += x[k][i] * x[k][j]
			}
		}
		m[i][i]++
		rhs[i] = 10 * rng.NormFloat64()
	}
	return m, rhs
}

// The monotone fit is the constrained least squares' optimum, whatever
// set of held coefficients it starts from: every monotone coefficient at
// zero or above, the gradient zero at every free one, and at every one
// held at zero pointing down (the optimum's conditions, which for a
// strictly convex problem only the optimum meets).
func TestConstrainedMeetsTheOptimumsConditions(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := range 200 {
		m, rhs := randomSystem(rng)
		var monotone, start [NumFeatures]bool
		for i := range monotone {
			monotone[i] = rng.IntN(3) > 0
			start[i] = rng.IntN(2) == 0
		}
		var cold [NumFeatures]bool
		theta, ok := constrained(&m, &rhs, &monotone, &cold)
		if !ok {
			t.Fatalf("trial %d: a positive definite system was not solved", trial)
		}
		warm, ok := constrained(&m, &rhs, &monotone, &start)
		if !ok {
			t.Fatalf("trial %d: not solved from a warm start", trial)
		}
		scale := 0.0
		for _, v := range rhs {
			scale = math.Max(scale, math.Abs(v))
		}
		for i := range NumFeatures {
			if math.Abs(theta[i]-warm[i]) > 1e-9*(1+math.Abs(theta[i])) {
				t.Fatalf("trial %d: coefficient %d is %v from no held set, %v from another", trial, i, theta[i], warm[i])
			}
			g := rhs[i]
			for j := range NumFeatures {
				g -= m[i][j] * theta[j]
			}
			switch {
			case monotone[i] && theta[i] < 0:
				t.Fatalf("trial %d: monotone coefficient %d is %v", trial, i, theta[i])
			case monotone[i] && theta[i] == 0:
				if g > 1e-9*scale {
					t.Fatalf("trial %d: coefficient %d held at zero would rise (gradient %v)", trial, i, g)
				}
			default:
				if math.Abs(g) > 1e-9*scale {
					t.Fatalf("trial %d: free coefficient %d has gradient %v", trial, i, g)
				}
			}
		}
	}
}

// With nothing monotone the fit is the plain solve of Mθ = rhs.
func TestConstrainedWithoutConstraintsSolves(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 8))
	m, rhs := randomSystem(rng)
	var monotone, held [NumFeatures]bool
	theta, ok := constrained(&m, &rhs, &monotone, &held)
	if !ok {
		t.Fatal("not solved")
	}
	for i := range NumFeatures {
		s := 0.0
		for j := range NumFeatures {
			s += m[i][j] * theta[j]
		}
		if math.Abs(s-rhs[i]) > 1e-9*(1+math.Abs(rhs[i])) {
			t.Fatalf("row %d: Mθ = %v, rhs %v", i, s, rhs[i])
		}
	}
}

// A matrix that is not positive definite is refused, not solved wrong.
func TestConstrainedRefusesASingularSystem(t *testing.T) {
	t.Parallel()
	var m [NumFeatures]Vector
	var rhs Vector
	var monotone, held [NumFeatures]bool
	if _, ok := constrained(&m, &rhs, &monotone, &held); ok {
		t.Fatal("a zero matrix was solved")
	}
}
