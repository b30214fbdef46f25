package api

import "go.yaml.in/yaml/v3"

// UnmarshalYAML reads a withdraw_release mapping of a config file as a
// whole: a key left out is its zero value (a mapping with only allow lets
// only those act_ids withdraw), never the value it replaces. Errors: not a
// mapping of percent and allow.
func (r *WithdrawRelease) UnmarshalYAML(n *yaml.Node) error {
	type plain WithdrawRelease // without this method
	var p plain
	if err := n.Decode(&p); err != nil {
		return err
	}
	*r = WithdrawRelease(p)
	return nil
}
