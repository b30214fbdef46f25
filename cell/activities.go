package cell

import (
	"log/slog"
	"time"

	"redcell/api"
	"redcell/cell/activity"
	"redcell/internal/clock"
	"redcell/model"
)

// activities is the cell's reward activities (Config.Activities): loaded by
// New (an invalid file stops the cell before it joins the cluster), reloaded
// on the admin port (admin.Activities). A reload is refused when a scene's
// budget or stock falls below what it has issued (issued); once swapped in,
// loaded sets the budgets this cell homes to the file's.
type activities struct {
	path   string // "" none
	clock  clock.Clock
	log    *slog.Logger
	holder activity.Holder
	issued activity.Issued      // nil: no check (at load: nothing issued by this process yet)
	loaded func(*activity.Tree) // nil: nothing to do
}

// load reads the file when the cell is built; an invalid file stops it.
func (a *activities) load() error {
	if a.path == "" {
		return nil
	}
	t, err := a.holder.Reload(a.path, a.clock.Now(), nil)
	if err == nil {
		a.warn(t)
	}
	return err
}

// warn logs what the loaded file holds that does nothing (a scene's
// compensate); the admin port answers it too.
func (a *activities) warn(t *activity.Tree) {
	for _, w := range t.Warnings {
		a.log.Warn("activities file: a key that does nothing", "path", t.Path, "version", t.Version, "warning", w)
	}
}

// Activities implements admin.Activities.
func (a *activities) Activities() api.ActivitiesResponse { return describe(a.holder.Tree()) }

// ReloadActivities implements admin.Activities: an invalid file is
// INVALID_ARGUMENT with every problem, and the loaded tree stays.
func (a *activities) ReloadActivities() (api.ActivitiesResponse, error) {
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

// activitiesLoaded follows a reload: the budgets this cell homes take the
// file's, and the scene limits forget the scenes the file no longer has
// (a scene's new rate needs nothing: each request reads it from its tree).
func (s *Server) activitiesLoaded(t *activity.Tree) {
	s.budgets.Sync(t)
	keep := func(key string) bool { return t.SceneByKey(key) != nil }
	for _, l := range s.rw.scenes {
		l.Keep(keep)
	}
}

// liveCells is how many cells the cluster map lists (at least 1): the N of
// the scene limits' fallback, rate/N each while memcached does not answer.
func (s *Server) liveCells() int {
	if s.peers != nil {
		if m := s.peers.Map(); m != nil {
			return max(len(m.Cells()), 1)
		}
	}
	return 1
}
