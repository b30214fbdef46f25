package rewards

import (
	"log/slog"
	"time"

	"redcell/api"
	"redcell/cell/activity"
	"redcell/internal/clock"
	"redcell/model"
)

// Activities is the cell's reward activities (cell.Config.Activities):
// loaded by LoadActivities (an invalid file stops the cell before it joins
// the cluster), reloaded on the admin port (admin.Activities). Once an
// Issuer is built over them, a reload is refused when a scene's budget or
// stock falls below what it has issued (issued), and once swapped in,
// loaded sets the budgets this cell homes to the file's.
type Activities struct {
	path   string // "" none
	clock  clock.Clock
	log    *slog.Logger
	holder activity.Holder
	issued activity.Issued      // nil: no check (at load: nothing issued by this process yet)
	loaded func(*activity.Tree) // nil: nothing to do
}

// LoadActivities reads the activities file at path ("": none, and the
// reload answers NOT_FOUND). Errors: the file's (activity.Parse lists
// every problem).
func LoadActivities(path string, clk clock.Clock, log *slog.Logger) (*Activities, error) {
	a := &Activities{path: path, clock: clock.Or(clk), log: log}
	if path == "" {
		return a, nil
	}
	t, err := a.holder.Reload(a.path, a.clock.Now(), nil)
	if err != nil {
		return nil, err
	}
	a.warn(t)
	return a, nil
}

// Tree is the loaded tree (nil: none loaded); it never changes once
// loaded (a reload swaps it whole).
func (a *Activities) Tree() *activity.Tree { return a.holder.Tree() }

// warn logs what the loaded file holds that does nothing (a scene's
// compensate); the admin port answers it too.
func (a *Activities) warn(t *activity.Tree) {
	for _, w := range t.Warnings {
		a.log.Warn("activities file: a key that does nothing", "path", t.Path, "version", t.Version, "warning", w)
	}
}

// Activities implements admin.Activities.
func (a *Activities) Activities() api.ActivitiesResponse { return describe(a.holder.Tree()) }

// ReloadActivities implements admin.Activities: an invalid file is
// INVALID_ARGUMENT with every problem, and the loaded tree stays.
func (a *Activities) ReloadActivities() (api.ActivitiesResponse, error) {
	if a.path == "" {
		return api.ActivitiesResponse{}, model.Errorf(model.ErrNotFound, "no activities file is configured (cell.activities)")
	}
	t, err := a.holder.Reload(a.path, a.clock.Now(), a.issued)
	if err != nil {
		return api.ActivitiesResponse{}, model.Errorf(model.ErrInvalidArgument, "%v (the loaded activities stay)", err)
	}
	a.warn(t)
	if a.loaded != nil {
		a.loaded(t)
	}
	return describe(t), nil
}

// describe is the admin port's view of a tree (nil: none loaded).
func describe(t *activity.Tree) api.ActivitiesResponse {
	out := api.ActivitiesResponse{Parents: []api.ActivityParent{}}
	if t == nil {
		return out
	}
	out.Loaded, out.Path, out.Version, out.LoadedMS, out.Warnings = true, t.Path, t.Version, t.Loaded.UnixMilli(), t.Warnings
	for _, p := range t.Parents() {
		ap := api.ActivityParent{ID: p.ID, Name: p.Name, Children: []api.ActivityChild{}}
		for _, c := range p.Children {
			ac := api.ActivityChild{ID: c.ID, Stage: string(c.Stage), Scenes: []string{}}
			if c.Start != nil {
				ac.Start = c.Start.UTC().Format(time.RFC3339)
			}
			if c.End != nil {
				ac.End = c.End.UTC().Format(time.RFC3339)
			}
			for _, r := range c.Rewards {
				for _, sc := range r.Scenes {
					ac.Scenes = append(ac.Scenes, sc.ID)
				}
			}
			ap.Children = append(ap.Children, ac)
		}
		out.Parents = append(out.Parents, ap)
	}
	return out
}
