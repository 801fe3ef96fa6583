// How the command-line entry points answer their command line: --help prints the usage (exit 0), a
// bad command line is said with the usage after it (exit 2).

// Says the error and the usage; the exit code.
export function usageError(message: string, usage: string): number {
  console.error(`${message}\n\n${usage}`);
  return 2;
}

// npm start and the release step take their settings from the environment only. An argument is not
// ignored (`npm run migrate -- --help` migrated, `npm start -- --port 4000` started on 3000): --help
// prints the usage, anything else is refused, unquoted (a URL with its password given by mistake).
export function refuseArguments(usage: string, argv = process.argv.slice(2)): void {
  if (!argv.length) return;
  if (argv.length === 1 && (argv[0] === '--help' || argv[0] === '-h')) {
    console.log(usage);
    process.exit(0);
  }
  process.exit(usageError(`Error: this command takes no arguments (${argv.length} given, not shown): its settings are environment variables`, usage));
}
