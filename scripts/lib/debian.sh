# Shared by scripts/e2e-cluster and scripts/images (sourced, not run).

# The Debian mirror this machine's apt sources name.
debian_mirror() {
  local m=""
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    m="$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources)"
  fi
  if [ -z "$m" ] && [ -f /etc/apt/sources.list ]; then
    m="$(awk '$1=="deb"{for(i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' /etc/apt/sources.list)"
  fi
  [ -n "$m" ] || die "no Debian mirror found in /etc/apt/sources.list{,.d/debian.sources}"
  printf '%s' "$m"
}

# Installs Debian packages, as root.
apt_install() {
  [ "$(id -u)" -eq 0 ] || die "needs root, and these Debian packages: $*"
  echo "Installing $*"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" > /dev/null
}

# An image name as containerd keeps it: docker.io/library/postgres:17 for postgres:17.
normalize() {
  local name="$1" first="${1%%/*}"
  if [ "$first" = "$name" ]; then
    name="docker.io/library/$name"
  elif [[ "$first" != *.* && "$first" != *:* && "$first" != localhost ]]; then
    name="docker.io/$name"
  fi
  printf '%s' "$name"
}
