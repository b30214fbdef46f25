package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"redcell/cell/rewardtoken"
)

const rewardsUsage = `usage: redcell rewards <keygen|rotate|reissue> [flags]

  keygen   make a reward token key file: redcell rewards keygen --out FILE [--id k1]
           (one active Ed25519 key; mode 0600; an existing file is refused)
  rotate   add a new active key:         redcell rewards rotate --keys FILE --id k2
           (the active key becomes verify-only: tokens it signed still verify;
           set a key's state to retired by hand to refuse its tokens; reload by
           restarting the cells)
  reissue  issue again the rewards a CSV file lists, through the router:
           redcell rewards reissue --router URL --api-key-file F --activity PARENT --file x.csv [--concurrency 8]
           (lines act_id,scene_id,rain_id,amount[,award_type]; idempotent per line;
           'redcell rewards reissue -h' says more)`

// runRewards runs the reward operations: keygen, rotate, reissue.
func runRewards(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintln(os.Stderr, rewardsUsage)
		return errUsage
	}
	verb := args[0]
	if verb == "reissue" { // flags of its own
		return runReissue(ctx, args[1:])
	}
	fs := flag.NewFlagSet("rewards "+verb, flag.ContinueOnError)
	out := fs.String("out", "", "keygen: the key file to write")
	keys := fs.String("keys", "", "rotate: the key file")
	id := fs.String("id", "", "the new key's ID, 1..16 of [A-Za-z0-9-] (keygen default k1)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch verb {
	case "keygen":
		if *out == "" {
			return errors.New("rewards keygen: give --out FILE")
		}
		if *id == "" {
			*id = "k1"
		}
		if err := rewardtoken.NewKeyFile(*out, *id); err != nil {
			return err
		}
		fmt.Printf("wrote %s with active key %s\n", *out, *id)
		return nil
	case "rotate":
		if *keys == "" || *id == "" {
			return errors.New("rewards rotate: give --keys FILE and --id NEWID")
		}
		if err := rewardtoken.Rotate(*keys, *id); err != nil {
			return err
		}
		fmt.Printf("%s: %s is the active key; the former one verifies only\n", *keys, *id)
		return nil
	}
	fmt.Fprintln(os.Stderr, rewardsUsage)
	return errUsage
}
