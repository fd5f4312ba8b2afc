# Sourced by the bed tests (bed_fault.sh, bed_resume.sh, bed_torchrun.sh, bed_elastic.sh), with
# $bed set to tools/cluster_bed.sh. `bed_up K` skips the test (exit 77, with the reason) where no
# bed can be made, removes what killed earlier runs left, makes a bed of K hosts owned by the test
# (MIRRORED_BED exported) and a work folder ($work), and removes both when the test exits
# (BED_KEEP=1 keeps the work folder and prints where it is).
bed_up() {
  "$bed" check || exit 77
  "$bed" clean  # what a killed earlier run left (never a bed of a run in progress)
  MIRRORED_BED=$(MIRRORED_BED_OWNER=$$ "$bed" up "$1")
  export MIRRORED_BED
  work=$(mktemp -d)
  trap bed_down EXIT
}
bed_down() {
  "$bed" down || true
  [ -n "${BED_KEEP:-}" ] && echo "kept $work" || rm -rf "$work"
}
