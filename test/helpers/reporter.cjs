// mocha's spec reporter plus the closing line CI reads: "N passed, N failed, N skipped". Under
// `npm test` it also writes the test or hook it is in to TEST_PROGRESS_FILE at each start and end,
// which the runner's watchdog (scripts/test-watchdog.ts) reads to tell a stuck run and where.
const fs = require('node:fs');
const Mocha = require('mocha');
const { EVENT_RUN_END, EVENT_TEST_BEGIN, EVENT_TEST_END, EVENT_HOOK_BEGIN, EVENT_HOOK_END } = Mocha.Runner.constants;

class SpecWithSummary extends Mocha.reporters.Spec {
  constructor(runner, options) {
    super(runner, options);
    const progressFile = process.env.TEST_PROGRESS_FILE;
    if (progressFile) {
      const note = (what) => (runnable) => fs.writeFileSync(progressFile, `${what} ${runnable.fullTitle()}\n(${runnable.file ?? runnable.parent?.file ?? 'no file'})\n`);
      runner.on(EVENT_TEST_BEGIN, note('in test'));
      runner.on(EVENT_TEST_END, note('after test'));
      runner.on(EVENT_HOOK_BEGIN, note('in'));
      runner.on(EVENT_HOOK_END, note('after'));
    }
    runner.once(EVENT_RUN_END, () => {
      const s = runner.stats;
      process.stdout.write(`\n${s.passes} passed, ${s.failures} failed, ${s.pending} skipped\n`);
    });
  }
}
module.exports = SpecWithSummary;
