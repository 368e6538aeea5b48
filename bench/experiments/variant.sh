# Sourced by the kernel-variant experiments (dispatch_variants.sh, m2n_copy_variants.sh), from the repository root.
# mk_variant TARGET DIR EDIT...: copies this tree (no build folders, shared/ or .git) into DIR, applies the shell edit
# EDIT there and builds TARGET into DIR/b; prints "built" or the build log's tail (log: DIR.log).
mk_variant() {
  local target=$1 dir=$2; shift 2
  rm -rf "$dir" && mkdir -p "$dir"
  tar --exclude=./build-gpu --exclude=./build --exclude=./shared --exclude=./.git -cf - . | tar -xf - -C "$dir"
  (cd "$dir" && eval "$@" && make BUILDDIR=b CUDA_HOME=/usr/local/cuda configure >"$dir.log" 2>&1 &&
     cmake --build b --target "$target" -j 8 >>"$dir.log" 2>&1 && echo "built ${dir##*/}" ||
     { echo "FAILED ${dir##*/}"; tail -5 "$dir.log"; })
}
