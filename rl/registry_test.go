package rl

import (
	"reflect"
	"strings"
	"testing"
)

// Every entry of the registry gives a recipe that fills and an objective
// of the expected kind with the recipe's clip range, aggregates as the
// entry says, and is refused a correction exactly when it carries its own
// IS weight and an aggregation exactly when it fixes its own.
func TestObjectiveRegistry(t *testing.T) {
	kinds := map[string]string{
		MiniRLDefault: "MiniRL", MiniRLNoIS: "MiniRL", MiniRLLenNorm: "MiniRL", MiniRLOldIS: "MiniRL", MiniRLNoClip: "MiniRL",
		ObjGRPO: "PPOClip", ObjDrGRPO: "PPOClip", ObjDAPO: "PPOClip", ObjGSPO: "PPOClip", ObjGSPOToken: "PPOClip", ObjPPO: "PPOClip",
		ObjCISPO: "CISPO",
	}
	if len(objectives) != len(kinds) {
		t.Fatalf("%d objectives registered, the test knows %d", len(objectives), len(kinds))
	}
	for _, spec := range objectives {
		r := parseRecipeOK(t, recipeBase, "algorithm.objective="+spec.Name, "algorithm.eps_low=0.11", "algorithm.eps_high=0.13")
		obj := r.Algorithm.objective(200)
		if got := reflect.TypeOf(obj).Name(); got != kinds[spec.Name] {
			t.Errorf("%s builds a %s, want a %s", spec.Name, got, kinds[spec.Name])
		}
		if got := objectiveEps(obj); got != [2]float64{0.11, 0.13} {
			t.Errorf("%s: clip range %v, want the recipe's [0.11 0.13]", spec.Name, got)
		}
		if got := r.Algorithm.aggregation(); got != spec.Aggregation {
			t.Errorf("%s aggregates by %s, the registry says %s", spec.Name, got, spec.Aggregation)
		}
		// The objective built aggregates as the registry says it does.
		if p, ok := obj.(PPOClip); ok && p.Aggregation != spec.Aggregation {
			t.Errorf("%s builds a PPOClip aggregating by %s, the registry says %s", spec.Name, p.Aggregation, spec.Aggregation)
		}
		if m, ok := obj.(MiniRL); ok && (m.Variant == MiniRLLenNorm) != (spec.Aggregation == SeqMeanTokenMean) {
			t.Errorf("%s builds MiniRL variant %s, the registry says it aggregates by %s", spec.Name, m.Variant, spec.Aggregation)
		}
		_, err := ParseRecipe([]byte(recipeBase), []string{"algorithm.objective=" + spec.Name, "algorithm.correction=token-tis"})
		if (err != nil) != spec.OwnIS {
			t.Errorf("%s with a token-tis correction: err = %v, own IS weight %v", spec.Name, err, spec.OwnIS)
		}
		_, err = ParseRecipe([]byte(recipeBase), []string{"algorithm.objective=" + spec.Name, "algorithm.aggregation=token-mean"})
		if (err != nil) != spec.FixedAggregation {
			t.Errorf("%s with aggregation token-mean: err = %v, fixed aggregation %v", spec.Name, err, spec.FixedAggregation)
		}
	}
	// An unknown name lists every registered one.
	err := parseRecipeErr(t, recipeBase, "algorithm.objective=reinforce")
	for _, spec := range objectives {
		if err == nil || !strings.Contains(err.Error(), spec.Name) {
			t.Fatalf("unknown objective: %v does not name %s", err, spec.Name)
		}
	}
	// A recipe's aggregation replaces a PPO-family default, with the
	// generation budget for the constant one.
	r := parseRecipeOK(t, recipeBase, "algorithm.objective=grpo", "algorithm.aggregation=constant-normalised")
	if p := r.Algorithm.objective(200).(PPOClip); p.Aggregation != ConstantNorm || p.Budget != 200 {
		t.Errorf("grpo with constant-normalised: %+v", p)
	}
}
