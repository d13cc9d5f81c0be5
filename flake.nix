{
  # A development shell with what `make report` and `make test` need from the system: the Python that
  # workflow/envs/cpu.lock was made for, make and git, and the C++ runtime and zlib that the manylinux wheels (torch,
  # numpy, tokenizers) load. The Python packages come from the hash lock through pip, as everywhere else
  # (torch and the Neuron stack are not taken from nixpkgs): the Makefile builds .venv with
  # `pip install --require-hashes -r workflow/envs/cpu.lock`. Needs Nix 2.4 or newer with the nix-command and flakes
  # features; the first `nix develop` downloads the nixpkgs source pinned in flake.lock.
  description = "Qwen3 on AWS Trainium: the pilot workflow";

  # nixos-25.11; flake.lock pins the exact revision and its narHash. With no network to compute one, the pair
  # is a published one: the nixpkgs node of NimaSaed/nix-config's flake.lock (commit 00c18877e51e), the
  # nixos-25.11 branch at rev e576e3c9cf9b (lastModified 1770136044).
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.11";

  outputs = { self, nixpkgs }:
    let
      # The lock is for x86_64 Linux (pip-compile resolved it there; torch's wheel is platform-specific).
      system = "x86_64-linux";
      pkgs = nixpkgs.legacyPackages.${system};
      pythonAttr = import ./nix/python.nix { lockFile = ./workflow/envs/cpu.lock; };
      python = pkgs.${pythonAttr};
      wheelLibraries = [ pkgs.stdenv.cc.cc.lib pkgs.zlib ];
    in
    {
      # What the shell provides, for `nix eval .#versions` (tests/test_flake.py checks the same offline).
      versions = { python = pythonAttr; lockFile = "workflow/envs/cpu.lock"; };

      devShells.${system}.default = pkgs.mkShell {
        packages = [ python pkgs.gnumake pkgs.git ];
        shellHook = ''
          export PYTHON=${python}/bin/python3
          export LD_LIBRARY_PATH=${pkgs.lib.makeLibraryPath wheelLibraries}''${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
          echo "make report | make test (build .venv from the hash lock workflow/envs/cpu.lock)"
        '';
      };
    };
}
