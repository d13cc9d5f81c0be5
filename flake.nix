{
  # A development shell with the interpreter and tools the Makefile expects. The Python packages
  # themselves come from envs/<backend>.txt through pip (torch and the Neuron stack are not taken
  # from nixpkgs, so the pins stay the single source of versions).
  description = "Qwen3 on AWS Trainium: the pilot workflow";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.05";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAll = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
    in
    {
      devShells = forAll (pkgs: {
        default = pkgs.mkShell {
          packages = [ pkgs.python311 pkgs.gnumake pkgs.git ];
          shellHook = ''
            export PYTHON=${pkgs.python311}/bin/python3
            echo "make report | make test (creates .venv from envs/cpu.txt)"
          '';
        };
      });
    };
}
