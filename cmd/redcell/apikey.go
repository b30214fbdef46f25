package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"redcell/router/apikey"
)

const apikeyUsage = `usage: redcell apikey <add|list|revoke> [flags]

  add     make a key:  redcell apikey add --keys FILE --app NAME --scopes read,deposit,send,open,identity|all [--out FILE]
          (identity binds users of any app to act_ids: for a trusted caller such
          as the account center; all includes it)
  list    the entries: redcell apikey list --keys FILE [--json]
  revoke  refuse one:  redcell apikey revoke --keys FILE --id ID

The key file is router.api_keys of the cluster config (--config FILE finds it
there). It holds only SHA-256 hashes: a new key is printed (or written to
--out) once and kept nowhere else. Routers read the file again within a
second of a change; a router's admin port (/admin/keys) does the same.`

// runAPIKey manages the API key file: add, list, revoke.
func runAPIKey(args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintln(os.Stderr, apikeyUsage)
		return errUsage
	}
	verb := args[0]
	fs := flag.NewFlagSet("apikey "+verb, flag.ContinueOnError)
	keysPath := fs.String("keys", "", "the API key file (default: router.api_keys of --config)")
	cfgPath := fs.String("config", "", "cluster config file naming the key file (router.api_keys)")
	app := fs.String("app", "", "add: the calling app the key is for, 1..64 of [A-Za-z0-9_-]")
	scopes := fs.String("scopes", "", "add: comma-separated scopes (read, deposit, send, open) or all")
	out := fs.String("out", "", "add: write the key to this file (mode 0600) instead of stdout")
	id := fs.String("id", "", "revoke: the key's id")
	asJSON := fs.Bool("json", false, "list: print JSON")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	path, err := apikeyFilePath(*keysPath, *cfgPath)
	if err != nil {
		return err
	}
	f, err := apikey.Open(path, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	if err != nil {
		return err
	}
	switch verb {
	case "add":
		return apikeyAdd(f, path, *app, *scopes, *out)
	case "list":
		return apikeyList(f, *asJSON)
	case "revoke":
		return apikeyRevoke(f, *id)
	}
	fmt.Fprintln(os.Stderr, apikeyUsage)
	return errUsage
}

// apikeyFilePath is the key file to manage: --keys, else router.api_keys
// of the --config file.
func apikeyFilePath(keysPath, cfgPath string) (string, error) {
	path := keysPath
	if path == "" && cfgPath != "" {
		fc, err := loadConfig(cfgPath)
		if err != nil {
			return "", err
		}
		if path, err = fc.apiKeysPath(); err != nil {
			return "", err
		}
	}
	if path == "" {
		return "", errors.New("apikey: give --keys FILE or --config FILE")
	}
	return path, nil
}

// apikeyAdd makes a key for app with the scopes named, adds its hash to
// the key file at path and prints the key on stdout, or writes it to out
// (mode 0600) when out is not empty.
func apikeyAdd(f *apikey.File, path, app, scopes, out string) error {
	sc, err := apikey.ParseScopes(scopes)
	if err != nil {
		return err
	}
	key, k, err := f.Add(app, sc, time.Now())
	if err != nil {
		return err
	}
	if out == "" {
		fmt.Println(key)
		fmt.Fprintf(os.Stderr, "key %s for app %s (scopes %s) added to %s; it is shown only this once\n", k.ID, k.App, scopes, path)
		return nil
	}
	if err := os.WriteFile(out, []byte(key+"\n"), 0o600); err != nil {
		return fmt.Errorf("apikey: %w", err)
	}
	if err := os.Chmod(out, 0o600); err != nil { // WriteFile keeps an existing file's mode
		return fmt.Errorf("apikey: %w", err)
	}
	fmt.Fprintf(os.Stderr, "key %s for app %s (scopes %s) added to %s and written to %s\n", k.ID, k.App, scopes, path, out)
	return nil
}

// apikeyList prints the key file's entries, a line each, or as JSON.
func apikeyList(f *apikey.File, asJSON bool) error {
	keys, err := f.List()
	if err != nil {
		return err
	}
	if asJSON {
		if keys == nil {
			keys = []apikey.Key{}
		}
		b, _ := json.MarshalIndent(map[string]any{"keys": keys}, "", "  ")
		fmt.Println(string(b))
		return nil
	}
	for _, k := range keys {
		state := "active"
		if k.RevokedAt != nil {
			state = "revoked " + k.RevokedAt.Format(time.RFC3339)
		}
		sc := make([]string, len(k.Scopes))
		for i, s := range k.Scopes {
			sc[i] = string(s)
		}
		fmt.Printf("%s  app=%s  scopes=%s  created=%s  %s\n", k.ID, k.App, strings.Join(sc, ","), k.CreatedAt.Format(time.RFC3339), state)
	}
	return nil
}

// apikeyRevoke marks the key with the id given revoked in the key file.
func apikeyRevoke(f *apikey.File, id string) error {
	k, err := f.Revoke(id, time.Now())
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "key %s of app %s revoked\n", k.ID, k.App)
	return nil
}
