package rl

import "strings"

// Objective names.
const (
	ObjMiniRL    = "minirl"
	ObjGRPO      = "grpo"
	ObjDrGRPO    = "dr-grpo"
	ObjDAPO      = "dapo"
	ObjCISPO     = "cispo"
	ObjGSPO      = "gspo"
	ObjGSPOToken = "gspo-token"
	ObjPPO       = "ppo"
)

// objectiveSpec is everything keel knows of one objective by name: the
// defaults a recipe gets, what it may and may not combine with, and how to
// build it. Recipe defaults, validation, error messages and the loop all
// read the one table, objectives, so that adding an objective is one entry.
type objectiveSpec struct {
	Name string
	// EpsLow and EpsHigh are the default clip range.
	EpsLow, EpsHigh float64
	// Advantage is the default advantage estimator.
	Advantage string
	// Aggregation is how the objective weighs a response's tokens when the
	// recipe sets none (the KL and entropy terms follow it too).
	Aggregation string
	// FixedAggregation: the objective's aggregation is part of its
	// definition, and a recipe may not set algorithm.aggregation.
	FixedAggregation bool
	// OwnIS: the objective carries its own importance weight against
	// mu_old (MiniRL's min(pi_theta/mu_old, C)), so a separate
	// training-inference correction would correct twice and is refused.
	OwnIS bool
	// build returns the objective with the recipe's settings; budget is
	// the generation budget (Dr. GRPO's constant).
	build func(a *Algorithm, budget int) Objective
}

// objectives lists every objective a recipe can name, in the order error
// messages give them.
var objectives = []objectiveSpec{
	miniRLSpec(MiniRLDefault, SeqSumMean, true),
	miniRLSpec(MiniRLNoIS, SeqSumMean, false),
	miniRLSpec(MiniRLLenNorm, SeqMeanTokenMean, true),
	miniRLSpec(MiniRLOldIS, SeqSumMean, true),
	miniRLSpec(MiniRLNoClip, SeqSumMean, true),
	ppoSpec(ObjGRPO, GroupMeanStd, func(int) PPOClip { return GRPO() }),
	ppoSpec(ObjDrGRPO, GroupMean, DrGRPO),
	ppoSpec(ObjDAPO, GroupMeanStd, func(int) PPOClip { return DAPO() }),
	{Name: ObjCISPO, EpsLow: 0.2, EpsHigh: 0.28, Advantage: GroupMeanStd, Aggregation: TokenMean, FixedAggregation: true,
		build: func(a *Algorithm, _ int) Objective { return CISPO{EpsLow: *a.EpsLow, EpsHigh: *a.EpsHigh} }},
	fixed(ppoSpec(ObjGSPO, GroupMeanStd, func(int) PPOClip { return GSPO() })),
	fixed(ppoSpec(ObjGSPOToken, GroupMeanStd, func(int) PPOClip { return GSPOToken() })),
	ppoSpec(ObjPPO, GroupMean, func(int) PPOClip { return PPO() }),
}

// miniRLSpec is a MiniRL variant: the paper's clip range and C, group-mean
// advantages, and its own aggregation.
func miniRLSpec(variant, agg string, ownIS bool) objectiveSpec {
	d := DefaultMiniRL()
	return objectiveSpec{Name: variant, EpsLow: d.EpsLow, EpsHigh: d.EpsHigh, Advantage: GroupMean, Aggregation: agg,
		FixedAggregation: true, OwnIS: ownIS,
		build: func(a *Algorithm, _ int) Objective {
			return MiniRL{Variant: variant, EpsLow: *a.EpsLow, EpsHigh: *a.EpsHigh, ISCap: a.ISCap}
		}}
}

// ppoSpec is a clipped surrogate of the PPO family, its defaults those of
// its constructor; the recipe's clip range and aggregation replace them.
func ppoSpec(name, adv string, ctor func(budget int) PPOClip) objectiveSpec {
	d := ctor(1)
	return objectiveSpec{Name: name, EpsLow: d.EpsLow, EpsHigh: d.EpsHigh, Advantage: adv, Aggregation: d.Aggregation,
		build: func(a *Algorithm, budget int) Objective {
			p := ctor(budget)
			p.EpsLow, p.EpsHigh = *a.EpsLow, *a.EpsHigh
			if a.Aggregation != "" {
				p.Aggregation = a.Aggregation
				if a.Aggregation == ConstantNorm {
					p.Budget = budget
				}
			}
			return p
		}}
}

func fixed(s objectiveSpec) objectiveSpec {
	s.FixedAggregation = true
	return s
}

// lookupObjective returns the entry of objectives named name.
func lookupObjective(name string) (objectiveSpec, bool) {
	for _, s := range objectives {
		if s.Name == name {
			return s, true
		}
	}
	return objectiveSpec{}, false
}

// objectiveNames lists the names for an error message: "a, b or c".
func objectiveNames() string {
	names := make([]string, len(objectives))
	for i, s := range objectives {
		names[i] = s.Name
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}
